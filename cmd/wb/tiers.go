package main

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"wb/session"
)

// maxColdP95 bounds --cold-p95: a provisioning deadline (3×) past half an hour would hold
// a concurrency slot for a guest that is not coming.
const maxColdP95 = 10 * time.Minute

// coldP95Flag is --cold-p95 TIER=DURATION, repeatable: a tier's cold-start p95 as this
// deployment measures it, from which the tier's provisioning deadline follows (3×). Tiers not
// named keep the platform's.
type coldP95Flag map[int]time.Duration

func (f *coldP95Flag) String() string {
	if f == nil || len(*f) == 0 {
		return ""
	}
	var s []string
	for _, n := range slices.Sorted(maps.Keys(*f)) {
		s = append(s, fmt.Sprintf("%d=%s", n, (*f)[n]))
	}
	return strings.Join(s, ",")
}

func (f *coldP95Flag) Set(v string) error {
	tier, dur, ok := strings.Cut(v, "=")
	if !ok {
		return fmt.Errorf("%q: want TIER=DURATION, say 2=5s", v)
	}
	n, err := strconv.Atoi(tier)
	if err != nil || n < 1 || n > len(session.Tiers{}) {
		return fmt.Errorf("%q: the tier must be 1 to %d", v, len(session.Tiers{}))
	}
	d, err := time.ParseDuration(dur)
	if err != nil || d <= 0 || d > maxColdP95 {
		return fmt.Errorf("%q: the duration must be above 0 and at most %s, say 5s", v, maxColdP95)
	}
	if *f == nil {
		*f = coldP95Flag{}
	}
	(*f)[n] = d
	return nil
}

// tiers answers the platform's tiers with the cold-start p95s this flag sets.
func (f coldP95Flag) tiers() session.Tiers {
	ts := session.DefaultTiers()
	for n, d := range f {
		ts[n-1].ColdP95 = d
	}
	return ts
}
