package quota

import (
	"encoding/json"
	"fmt"
	"os"

	"wb/session"
)

// Prices is the price table, in integer micro-USD. Defaults are in DefaultPrices and
// quota/PRICES.md; `wb serve --prices FILE` loads a JSON file of the same shape.
type Prices struct {
	// SessionPerSecond: micro-USD per billed second, by tier ("1"–"4") and size class.
	SessionPerSecond map[string]map[string]int64 `json:"session_s_micro_usd"`
	// PausedGiBMonth: micro-USD per GiB-month of memory and disk held while paused.
	PausedGiBMonth int64 `json:"paused_gib_month_micro_usd"`
	// SnapshotGiBMonth: micro-USD per GiB-month of snapshot storage.
	SnapshotGiBMonth int64 `json:"snapshot_gib_month_micro_usd"`
	// EgressPerGB: micro-USD per GB (10^9 bytes) of egress.
	EgressPerGB int64 `json:"egress_gb_micro_usd"`
}

// DefaultPrices is the platform's price table.
func DefaultPrices() Prices {
	return Prices{
		SessionPerSecond: map[string]map[string]int64{
			"1": {"s": 14, "m": 28},
			"2": {"s": 28, "m": 56, "l": 112},
			"3": {"s": 40, "m": 80, "l": 160, "xl": 320},
			"4": {"s": 60, "m": 120, "l": 240, "xl": 480},
		},
		PausedGiBMonth:   100_000,
		SnapshotGiBMonth: 20_000,
		EgressPerGB:      50_000,
	}
}

// LoadPrices reads a JSON price table; fields it leaves out keep their defaults.
func LoadPrices(path string) (Prices, error) {
	p := DefaultPrices()
	b, err := os.ReadFile(path)
	if err != nil {
		return p, fmt.Errorf("prices: %w", err)
	}
	var in Prices
	if err := json.Unmarshal(b, &in); err != nil {
		return p, fmt.Errorf("prices %s: %w", path, err)
	}
	for tier, sizes := range in.SessionPerSecond {
		if _, ok := p.SessionPerSecond[tier]; !ok {
			return p, fmt.Errorf("prices %s: unknown tier %q", path, tier)
		}
		for size, v := range sizes {
			if v < 0 {
				return p, fmt.Errorf("prices %s: tier %s size %s: negative price", path, tier, size)
			}
			p.SessionPerSecond[tier][size] = v
		}
	}
	for _, f := range []struct {
		in  int64
		out *int64
	}{{in.PausedGiBMonth, &p.PausedGiBMonth}, {in.SnapshotGiBMonth, &p.SnapshotGiBMonth}, {in.EgressPerGB, &p.EgressPerGB}} {
		if f.in < 0 {
			return p, fmt.Errorf("prices %s: negative price", path)
		}
		if f.in > 0 {
			*f.out = f.in
		}
	}
	return p, nil
}

// msPerMonth is the billing month: 30 days.
const msPerMonth = 30 * 24 * 3600 * 1000

// Cost is the price of one usage record, in nano-USD (10^-9), so that per-second prices
// apply exactly to milliseconds and nothing is rounded until a total is shown.
func (p Prices) Cost(r Record) int64 {
	var nano int64
	if rate := p.sessionRate(r.Tier, r.SizeClass); r.SessionMs > 0 {
		nano += r.SessionMs * rate // micro-USD per s = nano-USD per ms
	}
	if r.PausedMs > 0 {
		gib := int64(r.MemoryMiB)/1024 + int64(r.DiskGiB)
		if r.MemoryMiB%1024 != 0 {
			gib++ // a started GiB counts
		}
		nano += r.PausedMs * gib * p.PausedGiBMonth * 1000 / msPerMonth
	}
	if r.EgressBytes > 0 {
		nano += r.EgressBytes * p.EgressPerGB / 1_000_000 // micro per 10^9 B = nano per 10^6 B
	}
	return nano
}

func (p Prices) sessionRate(tier int, size string) int64 {
	sizes := p.SessionPerSecond[fmt.Sprint(tier)]
	if v, ok := sizes[size]; ok {
		return v
	}
	// A size the tier does not price (custom resources) pays the tier's largest price.
	var hi int64
	for _, c := range session.SizeClasses() {
		if v, ok := sizes[c.Name]; ok && v > hi {
			hi = v
		}
	}
	return hi
}
