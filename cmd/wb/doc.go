// Command wb is the platform's one binary: `wb serve` runs everything on one machine, `wb node`
// one more host for it, `wb agent` the process inside each guest. The callers' commands
// (sessions, runs, plugins, …) are package internal/cli's; main dispatches their names to it.
// This package parses flags and wires packages. `wb serve` and
// `wb node` lock their --data-dir (internal/datadir) before they touch it, and keep their
// runtime state inside it.
//
// wb builds for macOS and Windows too, where it is the callers' CLI: the files of the commands
// that run guests or run in one (serve, node, fleet, image, agent, load --fleet) build on Linux
// only, and elsewhere commands_other.go answers that they need it. TestCrossBuild keeps it so.
package main
