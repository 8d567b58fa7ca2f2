package session

import (
	"fmt"
	"slices"
	"strings"
)

// Runtime is a language a template can run code in for an ephemeral run: the code is passed
// as the last argument of Argv.
type Runtime struct {
	Name string   `json:"name"`
	Argv []string `json:"argv"`
}

// Template is a root filesystem plus defaults, pinned by digest.
type Template struct {
	Name     string    `json:"name"`
	Digest   string    `json:"digest"` // "sha256:…"
	Runtimes []Runtime `json:"runtimes"`
}

// Ref is the pinned reference, name@sha256:….
func (t Template) Ref() string { return t.Name + "@" + t.Digest }

// Catalog is the set of templates a deployment offers.
type Catalog []Template

// Resolve finds the template a request names, either bare ("tpl_base") or pinned
// ("tpl_base@sha256:…", which must match).
func (c Catalog) Resolve(ref string) (Template, error) {
	name, digest, pinned := strings.Cut(ref, "@")
	for _, t := range c {
		if t.Name != name {
			continue
		}
		if pinned && digest != t.Digest {
			return Template{}, &FieldError{Field: "template", Message: fmt.Sprintf("%s is pinned to %s here, not %s", name, t.Digest, digest)}
		}
		return t, nil
	}
	return Template{}, &FieldError{Field: "template", Message: fmt.Sprintf("unknown template %q; available: %s", ref, strings.Join(c.Names(), ", "))}
}

// Names lists the template names.
func (c Catalog) Names() []string {
	out := make([]string, len(c))
	for i, t := range c {
		out[i] = t.Name
	}
	return out
}

// Runtime finds a runtime by name in any template, preferring the first template that has it.
func (c Catalog) Runtime(name string) (Template, Runtime, error) {
	var names []string
	for _, t := range c {
		for _, r := range t.Runtimes {
			if r.Name == name {
				return t, r, nil
			}
			if !slices.Contains(names, r.Name) {
				names = append(names, r.Name)
			}
		}
	}
	return Template{}, Runtime{}, &FieldError{Field: "runtime", Message: fmt.Sprintf("unknown runtime %q; available: %s", name, strings.Join(names, ", "))}
}
