package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	captured := filepath.Join("..", "..", "testdata", "captured.txt")
	var out, errOut bytes.Buffer
	if err := run([]string{captured}, strings.NewReader(""), &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "CreateBoot/bare-runc: 1.124s/op") {
		t.Errorf("the table from a file:\n%s", out.String())
	}

	data, err := os.ReadFile(captured)
	if err != nil {
		t.Fatal(err)
	}
	var fromStdin bytes.Buffer
	bad := append([]byte("pkg: wb/x\nBenchmarkBroken-2 1 zzz ns/op\n"), data...)
	if err := run(nil, bytes.NewReader(bad), &fromStdin, &errOut); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(fromStdin.String(), "CreateBoot/bare-runc: 1.124s/op") {
		t.Errorf("the table from stdin:\n%s", fromStdin.String())
	}
	if !strings.Contains(errOut.String(), "stdin:2") {
		t.Errorf("the malformed line is not named: %q", errOut.String())
	}

	for _, c := range []struct {
		args  []string
		stdin string
		want  string
	}{
		{[]string{filepath.Join(t.TempDir(), "none.txt")}, "", "none.txt"},
		{[]string{captured, captured}, "", "one file"},
		{nil, "PASS\nok  \twb/x\t1s\n", "no benchmark result"},
	} {
		err := run(c.args, strings.NewReader(c.stdin), &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error saying %q", c.args, err, c.want)
		}
	}
}
