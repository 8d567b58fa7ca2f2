package policies

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// Outcome is what one policy's verdict did in a decision.
type Outcome struct {
	Policy  string `json:"policy"` // "platform" or pol_NAME@N
	Mode    Mode   `json:"mode"`
	Outcome string `json:"outcome"` // allow | deny | kill | stop project | warn | would deny | would kill | error …
}

// entry is one decision on its way to the log. Everything in it is owned by the log: the
// input value is never modified after the decision and result is already encoded.
type entry struct {
	at       time.Time
	project  string
	point    string
	outcome  string
	policies []Outcome
	input    ast.Value
	masked   []string
	result   any // encoded by the writer
	dur      time.Duration
}

type decisionLog struct {
	rdb     redis.UniversalClient
	log     *slog.Logger
	maxLen  int64
	ch      chan *entry
	quit    chan struct{}
	done    chan struct{}
	closed  atomic.Bool
	dropped atomic.Uint64
	counter prometheus.Counter // nil without a registerer
}

const droppedMetric = "wb_policy_decision_log_dropped_total"

func newDecisionLog(rdb redis.UniversalClient, log *slog.Logger, o DecisionLogOptions, reg prometheus.Registerer) (*decisionLog, error) {
	if o.Buffer <= 0 {
		o.Buffer = 4096
	}
	if o.MaxLen <= 0 {
		o.MaxLen = 10000
	}
	d := &decisionLog{rdb: rdb, log: log, maxLen: o.MaxLen, ch: make(chan *entry, o.Buffer),
		quit: make(chan struct{}), done: make(chan struct{})}
	if reg != nil {
		c := prometheus.NewCounter(prometheus.CounterOpts{
			Name: droppedMetric,
			Help: "Policy decision-log entries dropped because the log's buffer was full.",
		})
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, fmt.Errorf("policies: register %s: %w", droppedMetric, err)
			}
			existing, ok := are.ExistingCollector.(prometheus.Counter)
			if !ok {
				return nil, fmt.Errorf("policies: register %s: %w", droppedMetric, err)
			}
			c = existing
		}
		d.counter = c
	}
	go d.run()
	return d, nil
}

// add queues e, or drops and counts it when the buffer is full or the log is closed.
func (d *decisionLog) add(e *entry) {
	if !d.closed.Load() {
		select {
		case d.ch <- e:
			return
		default:
		}
	}
	d.dropped.Add(1)
	if d.counter != nil {
		d.counter.Inc()
	}
}

func (d *decisionLog) close(ctx context.Context) error {
	if d.closed.CompareAndSwap(false, true) {
		close(d.quit)
	}
	select {
	case <-d.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("policies: flush decision log: %w", ctx.Err())
	}
}

// batchMax bounds the entries written in one Redis pipeline.
const batchMax = 128

func (d *decisionLog) run() {
	defer close(d.done)
	batch := make([]*entry, 0, batchMax)
	for {
		select {
		case e := <-d.ch:
			d.write(d.fill(append(batch[:0], e)))
		case <-d.quit:
			for {
				b := d.fill(batch[:0])
				if len(b) == 0 {
					return
				}
				d.write(b)
			}
		}
	}
}

// fill adds the queued entries to batch, up to batchMax, without waiting.
func (d *decisionLog) fill(batch []*entry) []*entry {
	for len(batch) < batchMax {
		select {
		case e := <-d.ch:
			batch = append(batch, e)
		default:
			return batch
		}
	}
	return batch
}

// write logs a batch to slog and appends it to the projects' streams in one pipeline.
func (d *decisionLog) write(batch []*entry) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p := d.rdb.Pipeline()
	for _, e := range batch {
		in := maskedInput(e.input, e.masked)
		sum := sha256.Sum256(in)
		dg := "sha256:" + hex.EncodeToString(sum[:])
		pols, _ := json.Marshal(e.policies)
		res, err := json.Marshal(e.result)
		if err != nil {
			res = []byte(strconv.Quote("unencodable result: " + err.Error()))
		}
		res = boundedResult(res)
		outcome := clip(e.outcome, maxMessageBytes)
		level := slog.LevelDebug
		if e.outcome != "allow" {
			level = slog.LevelInfo
		}
		d.log.LogAttrs(ctx, level, "policy decision",
			slog.String("project", e.project), slog.String("point", e.point),
			slog.String("outcome", outcome), slog.String("policies", outcomesString(e.policies)),
			slog.String("input_digest", dg), slog.Duration("duration", e.dur),
			slog.String("result", string(res)))
		p.XAdd(ctx, &redis.XAddArgs{
			Stream: DecisionsKey(e.project), MaxLen: d.maxLen, Approx: true,
			Values: []any{
				"time", e.at.UTC().Format(time.RFC3339Nano),
				"point", e.point,
				"outcome", outcome,
				"policies", pols,
				"input_digest", dg,
				"input", in,
				"result", res,
				"duration_us", strconv.FormatInt(e.dur.Microseconds(), 10),
			},
		})
	}
	if _, err := p.Exec(ctx); err != nil {
		d.log.Warn("policies: write decision log", "entries", len(batch), "err", err)
	}
}

// maxResultBytes bounds the result one entry keeps (in slog and in the stream, which holds
// ~MaxLen entries per project): a decision may carry 64 policies' 64 messages of 1 KiB each.
const maxResultBytes = 8 << 10

// boundedResult answers a decision's JSON as it is when it fits maxResultBytes. Otherwise
// it keeps the messages of its lists (reasons, warnings) while they fit, each cut to
// maxMessageBytes, with "truncated": true and each list's "<name>_count"; strings are cut, and
// any other value that does not fit is replaced by its size ("<name>_bytes").
func boundedResult(res []byte) []byte {
	if len(res) <= maxResultBytes {
		return res
	}
	var m map[string]any
	if err := json.Unmarshal(res, &m); err != nil {
		return []byte(fmt.Sprintf(`{"truncated":true,"bytes":%d}`, len(res)))
	}
	out := map[string]any{"truncated": true}
	room := maxResultBytes - 256 // the marks and counts
	keys := slices.Sorted(maps.Keys(m))
	// Scalars first, then the lists, then what is left (a patch), each while it fits.
	for _, k := range keys {
		switch v := m[k].(type) {
		case string:
			out[k] = clip(v, maxMessageBytes)
			room -= len(k) + min(len(v), maxMessageBytes) + 8
		case bool, float64, nil:
			out[k] = v
			room -= len(k) + 8
		}
	}
	for _, k := range keys {
		list, ok := m[k].([]any)
		if !ok {
			continue
		}
		out[k+"_count"] = len(list)
		kept := []any{}
		for _, el := range list {
			s := clip(text(el), maxMessageBytes)
			if room -= len(s) + 8; room < 0 {
				break
			}
			kept = append(kept, s)
		}
		out[k] = kept
	}
	for _, k := range keys {
		if _, ok := m[k].(map[string]any); !ok {
			continue
		}
		b, _ := json.Marshal(m[k])
		if room -= len(b) + len(k) + 8; room >= 0 {
			out[k] = m[k]
		} else {
			out[k+"_bytes"] = len(b)
		}
	}
	b, err := json.Marshal(out)
	if err != nil || len(b) > maxResultBytes {
		return []byte(fmt.Sprintf(`{"truncated":true,"bytes":%d}`, len(res)))
	}
	return b
}

// maskedInput answers the JSON of the input with the masked paths replaced by "***". The
// digest is taken over it too, so it cannot be used to guess a masked value.
func maskedInput(v ast.Value, paths []string) []byte {
	if v == nil {
		return []byte("null")
	}
	return maskedJSON(v, paths)
}

func outcomesString(os []Outcome) string {
	parts := make([]string, 0, len(os))
	for _, o := range os {
		parts = append(parts, fmt.Sprintf("%s(%s)=%s", o.Policy, o.Mode, o.Outcome))
	}
	return strings.Join(parts, ",")
}

// maskedOf unions the masked paths of the policies of one decision.
func maskedOf(ps ...[]string) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}
