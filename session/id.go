package session

import (
	"crypto/rand"
	"crypto/sha256"
	"strings"
	"time"
)

// base62 in ASCII order, so that ids sort by creation time as plain strings.
const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// NewID returns prefix + 8 base62 characters of the millisecond time + 10 random ones.
// Ids with the same prefix sort by creation time, which list cursors rely on.
func NewID(prefix string, now time.Time) string {
	b := make([]byte, len(prefix)+18)
	copy(b, prefix)
	ms := uint64(now.UnixMilli())
	for i := len(prefix) + 7; i >= len(prefix); i-- {
		b[i] = base62[ms%62]
		ms /= 62
	}
	rnd := b[len(prefix)+8:]
	_, _ = rand.Read(rnd) // crypto/rand.Read never fails (Go ≥ 1.24)
	for i := range rnd {
		rnd[i] = base62[int(rnd[i])%62]
	}
	return string(b)
}

// ValidID reports whether id is prefix followed by the 18 base62 characters of NewID: an id of
// that form is a plain file name, safe to join into a path.
func ValidID(prefix, id string) bool {
	rest, ok := strings.CutPrefix(id, prefix)
	if !ok || len(rest) != 18 {
		return false
	}
	for i := 0; i < len(rest); i++ {
		if strings.IndexByte(base62, rest[i]) < 0 {
			return false
		}
	}
	return true
}

// DerivedID returns an id of NewID's form whose time is at and whose other 10 characters are
// derived from key: the same (at, key) always gives the same id, for an event sent again
// (at least once) that its receivers deduplicate by id.
func DerivedID(prefix string, at time.Time, key string) string {
	id := []byte(NewID(prefix, at))
	sum := sha256.Sum256([]byte(key))
	rest := id[len(prefix)+8:]
	for i := range rest {
		rest[i] = base62[int(sum[i])%62]
	}
	return string(id)
}
