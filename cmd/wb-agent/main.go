package main

import (
	"fmt"
	"os"

	"wb/agent"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] != "agent" {
		fmt.Fprintln(os.Stderr, "usage: wb-agent agent [flags] (see wb-agent agent --help)")
		os.Exit(2)
	}
	if err := agent.Main(os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "wb agent:", err)
		os.Exit(1)
	}
}
