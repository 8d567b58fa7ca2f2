// Command noop allows everything: the cheapest SDK plugin, for benchmarks.
package main
