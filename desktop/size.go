package desktop

import (
	"fmt"
	"slices"

	"wb/session"
)

// Size is a desktop's size: one of the session size classes (s, m, l, xl), which gives the
// resources of the session it runs as.
type Size string

// DefaultSize is the size of a desktop created without one.
const DefaultSize Size = "s"

// Sizes lists the sizes from smallest to largest.
func Sizes() []Size {
	var out []Size
	for _, c := range session.SizeClasses() {
		out = append(out, Size(c.Name))
	}
	return out
}

// ParseSize answers the size named s, or a *session.FieldError naming field.
func ParseSize(field, s string) (Size, error) {
	if !slices.Contains(Sizes(), Size(s)) {
		return "", &session.FieldError{Field: field, Message: fmt.Sprintf("unknown size %q; expected one of %v", s, Sizes())}
	}
	return Size(s), nil
}

// Resources are the resources of the size's session.
func (z Size) Resources() session.Resources {
	for _, c := range session.SizeClasses() {
		if c.Name == string(z) {
			return session.Resources{VCPU: c.VCPU, MemoryMiB: c.MemoryMiB, DiskGiB: c.DiskGiB, SizeClass: c.Name}
		}
	}
	return session.Resources{}
}
