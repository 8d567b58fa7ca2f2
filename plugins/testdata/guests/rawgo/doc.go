// Command rawgo implements the ABI directly, without the SDK, and allows everything without
// reading its input: the host's and the Go runtime's own cost per call, for benchmarks.
package main
