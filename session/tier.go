package session

import (
	"fmt"
	"slices"
	"time"
)

// Timer limits (seed 000, table "Timeouts", and "Pause and resume").
const (
	IdleTimeoutMinS     = 30
	IdleTimeoutMaxS     = 7200
	IdleTimeoutDefaultS = 300
	LifetimeMinS        = 60
	LifetimeMaxS        = 86400
	LifetimeDefaultS    = 3600
	// PauseMax is how long a session may stay paused before it is stopped.
	PauseMax = time.Hour
	// Warnings fire at these fractions of the idle timeout and of the lifetime.
	IdleWarningPercent     = 80
	LifetimeWarningPercent = 90
	// ProvisionDeadlineFactor × the tier's cold p95 is the provisioning deadline.
	ProvisionDeadlineFactor = 3
)

// SizeClass is a named bundle of resources.
type SizeClass struct {
	Name      string
	VCPU      int
	MemoryMiB int
	DiskGiB   int
}

// SizeClasses are the classes from smallest to largest. "m" is the seed's example.
func SizeClasses() []SizeClass {
	return []SizeClass{
		{"s", 1, 2048, 10},
		{"m", 2, 4096, 20},
		{"l", 4, 8192, 40},
		{"xl", 8, 16384, 80},
	}
}

// Tier is one of the four session tiers and its limits.
type Tier struct {
	Number int
	// CanPause: pause (and so resume) only on tiers 2–4.
	CanPause bool
	// MaxLifetimeS is the tier's ceiling for max_lifetime_s (within 60–86400).
	MaxLifetimeS int
	// ColdP95 is the tier's measured cold-start p95; the provisioning deadline is 3× it.
	ColdP95 time.Duration
	// DefaultSize and LargestSize bound the size classes the tier offers.
	DefaultSize string
	LargestSize string
}

// ProvisionDeadline is how long a session may stay pending or provisioning.
func (t Tier) ProvisionDeadline() time.Duration { return ProvisionDeadlineFactor * t.ColdP95 }

// Tiers holds the four tiers; index 0 is tier 1. Operators may change ColdP95 per tier.
type Tiers [4]Tier

// DefaultTiers returns the platform's tiers.
func DefaultTiers() Tiers {
	return Tiers{
		{Number: 1, CanPause: false, MaxLifetimeS: 3600, ColdP95: 2 * time.Second, DefaultSize: "s", LargestSize: "m"},
		{Number: 2, CanPause: true, MaxLifetimeS: 21600, ColdP95: 3 * time.Second, DefaultSize: "s", LargestSize: "l"},
		{Number: 3, CanPause: true, MaxLifetimeS: 43200, ColdP95: 5 * time.Second, DefaultSize: "m", LargestSize: "xl"},
		{Number: 4, CanPause: true, MaxLifetimeS: 86400, ColdP95: 10 * time.Second, DefaultSize: "m", LargestSize: "xl"},
	}
}

// Tier returns tier n (1–4) or a *FieldError naming "tier".
func (ts Tiers) Tier(n int) (Tier, error) {
	if n < 1 || n > len(ts) {
		return Tier{}, &FieldError{Field: "tier", Message: fmt.Sprintf("must be 1–4, got %d", n)}
	}
	return ts[n-1], nil
}

// ValidateTimeouts checks idle_timeout_s and max_lifetime_s against the seed's ranges and
// the tier's lifetime ceiling.
func (t Tier) ValidateTimeouts(idleS, lifetimeS int) error {
	if idleS < IdleTimeoutMinS || idleS > IdleTimeoutMaxS {
		return &FieldError{Field: "idle_timeout_s", Message: fmt.Sprintf("must be %d–%d seconds, got %d", IdleTimeoutMinS, IdleTimeoutMaxS, idleS)}
	}
	ceiling := min(t.MaxLifetimeS, LifetimeMaxS)
	if lifetimeS < LifetimeMinS || lifetimeS > ceiling {
		return &FieldError{Field: "max_lifetime_s", Message: fmt.Sprintf("must be %d–%d seconds on tier %d, got %d", LifetimeMinS, ceiling, t.Number, lifetimeS)}
	}
	return nil
}

// Resources of a session. SizeClass is the smallest class that holds the others.
type Resources struct {
	VCPU      int    `json:"vcpu"`
	MemoryMiB int    `json:"memory_mib"`
	DiskGiB   int    `json:"disk_gib"`
	SizeClass string `json:"size_class"`
}

// ResourceRequest is what a caller asks for: a size class, or any of vcpu, memory_mib and
// disk_gib (the rest come from the tier's default class).
type ResourceRequest struct {
	SizeClass string `json:"size_class,omitempty"`
	VCPU      *int   `json:"vcpu,omitempty"`
	MemoryMiB *int   `json:"memory_mib,omitempty"`
	DiskGiB   *int   `json:"disk_gib,omitempty"`
}

// Minimum explicit resources.
const (
	MinMemoryMiB = 64
	MinVCPU      = 1
	MinDiskGiB   = 1
)

// Resolve turns a request (nil for the default) into resources allowed on the tier.
func (t Tier) Resolve(req *ResourceRequest) (Resources, error) {
	classes := SizeClasses()
	idx := func(name string) int {
		return slices.IndexFunc(classes, func(c SizeClass) bool { return c.Name == name })
	}
	largest := classes[idx(t.LargestSize)]
	if req == nil {
		req = &ResourceRequest{}
	}
	if req.SizeClass != "" {
		if req.VCPU != nil || req.MemoryMiB != nil || req.DiskGiB != nil {
			return Resources{}, &FieldError{Field: "resources", Message: "give size_class or vcpu/memory_mib/disk_gib, not both"}
		}
		i := idx(req.SizeClass)
		if i < 0 || i > idx(t.LargestSize) {
			// The classes the tier offers, for the message alone (a create that is allowed
			// makes no list).
			names := make([]string, 0, len(classes))
			for _, c := range classes[:idx(t.LargestSize)+1] {
				names = append(names, c.Name)
			}
			return Resources{}, &FieldError{Field: "resources.size_class", Message: fmt.Sprintf("tier %d offers %v, got %q", t.Number, names, req.SizeClass)}
		}
		c := classes[i]
		return Resources{VCPU: c.VCPU, MemoryMiB: c.MemoryMiB, DiskGiB: c.DiskGiB, SizeClass: c.Name}, nil
	}
	def := classes[idx(t.DefaultSize)]
	r := Resources{VCPU: def.VCPU, MemoryMiB: def.MemoryMiB, DiskGiB: def.DiskGiB}
	for _, f := range []struct {
		name     string
		in       *int
		out      *int
		min, max int
	}{
		{"resources.vcpu", req.VCPU, &r.VCPU, MinVCPU, largest.VCPU},
		{"resources.memory_mib", req.MemoryMiB, &r.MemoryMiB, MinMemoryMiB, largest.MemoryMiB},
		{"resources.disk_gib", req.DiskGiB, &r.DiskGiB, MinDiskGiB, largest.DiskGiB},
	} {
		if f.in == nil {
			continue
		}
		if *f.in < f.min || *f.in > f.max {
			return Resources{}, &FieldError{Field: f.name, Message: fmt.Sprintf("must be %d–%d on tier %d, got %d", f.min, f.max, t.Number, *f.in)}
		}
		*f.out = *f.in
	}
	for _, c := range classes {
		if r.VCPU <= c.VCPU && r.MemoryMiB <= c.MemoryMiB && r.DiskGiB <= c.DiskGiB {
			r.SizeClass = c.Name
			break
		}
	}
	return r, nil
}
