package session

import (
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"
)

func TestCatalogRuntime(t *testing.T) {
	sh := Runtime{Name: "sh", Argv: []string{"/bin/sh", "-c"}}
	py := Runtime{Name: "python3", Argv: []string{"/usr/bin/python3", "-c"}, Version: "3.11.7"}
	node := Runtime{Name: "node", Argv: []string{"/usr/bin/node", "-e"}, Version: "18.19.0"}
	goRT := Runtime{Name: "go", Version: "1.26.0"}
	gcc := Runtime{Name: "gcc", Version: "12.2.0"}
	c := Catalog{
		{Name: "tpl_base", Runtimes: []Runtime{sh}},
		{Name: "tpl_dev_polyglot", Runtimes: []Runtime{sh, py, node, goRT, gcc}},
	}
	for _, tc := range []struct{ ask, tpl, runtime string }{
		{"sh", "tpl_base", "sh"},
		{"python3", "tpl_dev_polyglot", "python3"},
		{"python", "tpl_dev_polyglot", "python3"},
		{"python3.11", "tpl_dev_polyglot", "python3"},
		{"python3.11.7", "tpl_dev_polyglot", "python3"},
		{"py", "tpl_dev_polyglot", "python3"},
		{"node18", "tpl_dev_polyglot", "node"},
		{"nodejs", "tpl_dev_polyglot", "node"},
		{"javascript", "tpl_dev_polyglot", "node"},
		{"go1.26", "tpl_dev_polyglot", "go"},
		{"golang", "tpl_dev_polyglot", "go"},
		{"c", "tpl_dev_polyglot", "gcc"},
	} {
		tpl, rt, err := c.Runtime(tc.ask)
		if err != nil || tpl.Name != tc.tpl || rt.Name != tc.runtime {
			t.Errorf("Runtime(%q) = %s, %s, %v; want %s, %s", tc.ask, tpl.Name, rt.Name, err, tc.tpl, tc.runtime)
		}
	}
	for _, tc := range []struct{ ask, want string }{
		{"python3.12", `runtime "python3.12" is not offered here: its python3 is version 3.11.7; ask for "python3" (or "python3.11")`},
		{"python3.1", `its python3 is version 3.11.7`}, // a version's components, not its characters
		{"python2", `its python3 is version 3.11.7`},
		{"node20", `its node is version 18.19.0`},
		{"ruby", `unknown runtime "ruby"; available: sh, python3 (3.11.7), node (18.19.0), go (1.26.0), gcc (12.2.0)`},
		{"python3..11", `unknown runtime "python3..11"`},
		{"Python3", `unknown runtime "Python3"`},
		{"", "must name a runtime"},
		{strings.Repeat("p", 65), "must name a runtime (at most 64 bytes)"},
	} {
		_, rt, err := c.Runtime(tc.ask)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != "runtime" || !strings.Contains(fe.Message, tc.want) {
			t.Errorf("Runtime(%.20q) = %s, %v; want a runtime FieldError containing %q", tc.ask, rt.Name, err, tc.want)
		}
	}
	// A version asked of a runtime whose version is not known (an older node's catalog).
	old := Catalog{{Name: "tpl_dev_polyglot", Runtimes: []Runtime{{Name: "python3"}}}}
	if _, rt, err := old.Runtime("python"); err != nil || rt.Name != "python3" {
		t.Errorf("python of an unversioned python3: %s, %v", rt.Name, err)
	}
	if _, _, err := old.Runtime("python3.11"); err == nil || !strings.Contains(err.Error(), `the version of its python3 is not known; ask for "python3"`) {
		t.Errorf("python3.11 of an unversioned python3: %v", err)
	}
}

// TestDocumentedRuntimeAliases: each alias the API document names for a run's runtime finds a
// runtime in a catalog of every runtime the templates offer (hypervisor/templates: sh, python3,
// node, gcc): an alias of a runtime no longer offered is a 400 to the caller who read the doc.
func TestDocumentedRuntimeAliases(t *testing.T) {
	b, err := os.ReadFile("../gateway/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`or an alias \(([^)]*)\)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("the document names no runtime aliases (\"or an alias (…)\"): has its text changed?")
	}
	c := Catalog{{Name: "tpl_dev_polyglot", Runtimes: []Runtime{{Name: "sh"}, {Name: "python3", Version: "3.11.2"},
		{Name: "node", Version: "18.19.0"}, {Name: "gcc", Version: "12.2.0"}}}}
	for _, q := range regexp.MustCompile(`\\"([^\\]+)\\"`).FindAllSubmatch(m[1], -1) {
		if _, rt, err := c.Runtime(string(q[1])); err != nil {
			t.Errorf("the documented alias %q: %v", q[1], err)
		} else {
			t.Logf("%s: %s", q[1], rt.Name)
		}
	}
}
