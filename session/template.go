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
	// Version is the runtime's own ("3.11.7"), empty when not known.
	Version string `json:"version,omitempty"`
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

// Runtime finds the runtime a run names, in the first template that has it: by its name
// ("python3"), by its family with a version ("python3.11", "node18": the runtime whose
// version begins so), by its family alone ("python") or by a common alias ("nodejs"). A name
// that matches none is a FieldError that lists what is offered, with versions.
func (c Catalog) Runtime(name string) (Template, Runtime, error) {
	for _, t := range c {
		for _, r := range t.Runtimes {
			if r.Name == name {
				return t, r, nil
			}
		}
	}
	if name == "" || len(name) > 64 {
		return Template{}, Runtime{}, &FieldError{Field: "runtime", Message: "must name a runtime (at most 64 bytes): " + strings.Join(c.runtimesOffered(), ", ")}
	}
	family, version := runtimeFamily(name)
	if a := runtimeAlias(name); a != "" {
		family, version = a, ""
	}
	var near []Runtime // the family's runtimes, of other versions
	for _, t := range c {
		for _, r := range t.Runtimes {
			if f, _ := runtimeFamily(r.Name); family != "" && f == family {
				if versionHasPrefix(r.Version, version) {
					return t, r, nil
				}
				near = append(near, r)
			}
		}
	}
	msg := fmt.Sprintf("unknown runtime %q; available: %s", name, strings.Join(c.runtimesOffered(), ", "))
	if len(near) > 0 {
		r := near[0]
		if r.Version == "" {
			msg = fmt.Sprintf("runtime %q is not offered here: the version of its %s is not known; ask for %q", name, r.Name, r.Name)
		} else {
			msg = fmt.Sprintf("runtime %q is not offered here: its %s is version %s; ask for %q (or %q)", name, r.Name, r.Version, r.Name, family+majorMinor(r.Version))
		}
	}
	return Template{}, Runtime{}, &FieldError{Field: "runtime", Message: msg}
}

// runtimesOffered lists the catalog's runtimes once each, with their versions: "sh",
// "python3 (3.11.7)".
func (c Catalog) runtimesOffered() []string {
	var offered []string
	for _, t := range c {
		for _, r := range t.Runtimes {
			o := r.Name
			if r.Version != "" {
				o += " (" + r.Version + ")"
			}
			if !slices.Contains(offered, o) {
				offered = append(offered, o)
			}
		}
	}
	return offered
}

// runtimeAlias is the runtime family that another name callers commonly use stands for
// ("nodejs": "node"), or "".
func runtimeAlias(name string) string {
	switch name {
	case "nodejs", "javascript", "js":
		return "node"
	case "golang":
		return "go"
	case "c":
		return "gcc"
	case "py":
		return "python"
	}
	return ""
}

// runtimeFamily splits a runtime's name into its family and the version it names, both
// empty when name is not of that form: "python3.11" is "python" and "3.11", "python3"
// "python" and "3", "node" "node" and "".
func runtimeFamily(name string) (family, version string) {
	i := len(name)
	for i > 0 && (name[i-1] == '.' || name[i-1] >= '0' && name[i-1] <= '9') {
		i--
	}
	family, version = name[:i], name[i:]
	if family == "" || strings.Trim(family, "abcdefghijklmnopqrstuvwxyz") != "" ||
		version != "" && (version[0] == '.' || version[len(version)-1] == '.' || strings.Contains(version, "..")) {
		return "", ""
	}
	return family, version
}

// versionHasPrefix reports whether version v ("3.11.7") begins with the components of p
// ("3.11", "3"; "" matches any v, even an unknown one).
func versionHasPrefix(v, p string) bool {
	return p == "" || v == p || strings.HasPrefix(v, p+".")
}

// majorMinor is a version's first two components ("3.11.7" → "3.11").
func majorMinor(v string) string {
	if i := strings.IndexByte(v, '.'); i >= 0 {
		if j := strings.IndexByte(v[i+1:], '.'); j >= 0 {
			return v[:i+1+j]
		}
	}
	return v
}
