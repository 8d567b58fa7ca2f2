// Command benchtable prints one table of the go test -bench output in the file named (or on
// standard input): each figure, its baseline from the same run, and their ratio. The
// pairing is benchtable.Pairs. make bench runs it on bin/bench.txt.
//
//	go run ./internal/benchtable/cmd/benchtable bin/bench.txt
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"wb/internal/benchtable"
)

func main() {
	if err := run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	pairs := benchtable.Pairs()
	if err := benchtable.Validate(pairs); err != nil {
		return fmt.Errorf("the declared pairs: %w", err)
	}
	in, name := stdin, "stdin"
	switch len(args) {
	case 0:
	case 1:
		f, err := os.Open(args[0])
		if err != nil {
			return fmt.Errorf("benchmark output: %w", err)
		}
		defer f.Close()
		in, name = f, args[0]
	default:
		return fmt.Errorf("one file of benchmark output at most, got %d: %q", len(args), args)
	}
	all, err := benchtable.Parse(in, name)
	if err != nil {
		return err
	}
	for _, s := range all.Skipped {
		fmt.Fprintln(stderr, "benchtable: skipped a malformed result:", s)
	}
	if len(all.Measures) == 0 {
		return errors.New("no benchmark result in the input")
	}
	return benchtable.Write(stdout, benchtable.Table(all, pairs))
}
