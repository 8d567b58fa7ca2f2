package policies

import (
	"context"
	"encoding/json"
	"sync"
)

// docMemo remembers a deterministic policy's documents by input. The platform's runtime
// policy is asked before every exec and PTY: about 30 µs hot, but ten times that when the
// guest's work since the last exec (a gVisor sandbox's, above all) has cooled the CPU's
// caches, and a session mostly asks again about a command it ran before. Bounded: at most
// memoEntries documents (then it starts over), keys of at most memoKeyBytes.
type docMemo struct {
	mu   sync.Mutex
	docs map[string]map[string]any
	hits uint64
}

const (
	memoEntries  = 4096
	memoKeyBytes = 2048
)

// memoKey is the input's key: its JSON (map keys sorted, so equal inputs have one key), or
// "" when it is too long to keep or cannot be encoded.
func memoKey(input map[string]any) string {
	b, err := json.Marshal(input)
	if err != nil || len(b) > memoKeyBytes {
		return ""
	}
	return string(b)
}

// get answers the document kept for key. It is shared: nobody may change it.
func (m *docMemo) get(key string) (map[string]any, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	doc, ok := m.docs[key]
	if ok {
		m.hits++
	}
	return doc, ok
}

func (m *docMemo) put(key string, doc map[string]any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.docs == nil || len(m.docs) >= memoEntries {
		m.docs = make(map[string]map[string]any)
	}
	m.docs[key] = doc
}

// evalRemembered is eval, through memo under key; key "" evaluates every time.
func (ev *evaluation) evalRemembered(ctx context.Context, p *policy, memo *docMemo, key string) (map[string]any, error) {
	if key != "" {
		if doc, ok := memo.get(key); ok {
			ev.masked = append(ev.masked, p.Masked)
			return doc, nil
		}
	}
	doc, err := ev.eval(ctx, p)
	if err == nil && key != "" {
		memo.put(key, doc)
	}
	return doc, err
}
