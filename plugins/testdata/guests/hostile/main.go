package main

import (
	"strings"

	"wb/plugins/sdk"
)

var hoard [][]byte

func decide(in sdk.Input) sdk.Decision {
	switch in.Request.Template {
	case "panic":
		panic("boom")
	case "oom":
		for {
			hoard = append(hoard, make([]byte, 1<<20))
		}
	case "spin":
		n := 0
		for {
			n++
		}
	case "log":
		for i := range 100 {
			sdk.Log(sdk.LevelInfo, "line "+strings.Repeat("x", i))
		}
	case "exit":
		// A deadlock: the Go runtime reports it and exits.
		select {}
	}
	d := sdk.Allow()
	if v, ok := sdk.Config("echo"); ok {
		d = d.Warn("echo:" + v)
	}
	if _, ok := sdk.Config("missing"); ok {
		d = sdk.Deny("missing key answered")
	}
	return d
}

func init() { sdk.Handle(decide) }

func main() {}
