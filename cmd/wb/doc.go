// Command wb is the platform's one binary: `wb serve` runs everything on one machine; other
// roles and client commands are subcommands. This package parses flags and wires packages.
package main
