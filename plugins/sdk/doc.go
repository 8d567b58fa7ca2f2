// Package sdk writes wb decision plugins in Go. It hides the ABI of plugins/ABI.md behind one
// call:
//
//	package main
//
//	import "wb/plugins/sdk"
//
//	func init() {
//		sdk.Handle(func(in sdk.Input) sdk.Decision {
//			if in.Point == sdk.PointAdmission && in.Request.Template == "gpu" {
//				return sdk.Deny("no GPU templates here")
//			}
//			return sdk.Allow()
//		})
//	}
//
//	func main() {} // never runs: the module is a reactor
//
// Build it as a WASI reactor:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o plugin.wasm .
//
// With -buildmode=c-shared the host calls the module's _initialize once per instance, which runs
// the package initialisers (so sdk.Handle must be called from init) and never main. The host may
// reuse an instance for many calls, one at a time, or replace it at any moment: keep no state
// that a decision depends on between calls.
//
// The SDK parses the input and writes the result without encoding/json (reflection is slow in
// a guest and makes the module bigger); avoid os and file access (the host has no file system
// and rejects modules that import path_open).
package sdk
