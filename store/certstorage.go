package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// CertStorage is certmagic's Storage on Redis: every gateway that serves TLS over the same
// Redis shares its certificates, ACME account and challenge tokens, and its locks make one
// of them issue while the others wait and then load what it stored.
//
// It has certmagic's method set (certmagic.Storage v0.25.6) except that Stat answers
// CertKeyInfo, a struct with certmagic.KeyInfo's fields, so that store, imported by nearly
// every package, does not compile and link certmagic; cmd/wb converts it in a one-line
// adapter. Keys are certmagic's: slash-separated, no leading or trailing slash; a "folder" is
// any prefix of a stored key up to a slash.
type CertStorage struct {
	rdb   redis.UniversalClient
	lease time.Duration
	now   func() time.Time

	mu   sync.Mutex
	held map[string]*heldCertLock // by lock name: the locks this value holds
}

// CertKeyInfo is certmagic.KeyInfo (same fields, same order, so a conversion works).
type CertKeyInfo struct {
	Key        string
	Modified   time.Time
	Size       int64
	IsTerminal bool // false for a folder (a prefix of other keys)
}

const (
	// MaxCertValue bounds one stored value: a certificate chain, a key or an account is a
	// few KiB, so anything near this is a bug or abuse, not a certificate.
	MaxCertValue = 2 << 20
	// maxCertKey bounds a key (certmagic's longest: a prefix, an issuer, a 253-byte name twice).
	maxCertKey = 2048
	// DefaultCertLockLease is how long a lock outlives its holder's last renewal: a crashed
	// gateway's issuance blocks the others that long at most. The holder renews at a third.
	DefaultCertLockLease = 15 * time.Second
	// certLockPollMin and certLockPollMax bound the wait between two attempts at a held lock:
	// locks guard issuances that take seconds, so a waiter need not hear of a release sooner.
	certLockPollMin = 50 * time.Millisecond
	certLockPollMax = time.Second
	// certListPage is how many index entries one List round trip reads.
	certListPage = 1000
)

// CertStorage answers the certificate storage over this Store's Redis. lease is how long a
// lock survives its holder without renewal (0: DefaultCertLockLease).
func (s *Store) CertStorage(lease time.Duration) *CertStorage {
	if lease <= 0 {
		lease = DefaultCertLockLease
	}
	return &CertStorage{rdb: s.rdb, lease: lease, now: s.now, held: map[string]*heldCertLock{}}
}

// String names the storage in certmagic's logs.
func (c *CertStorage) String() string { return "redis:" + certFilesKey }

// certKeys are the keys every script of the storage is given (one slot).
var certKeys = []string{certFilesKey, certModifiedKey, certIndexKey}

// folderRange answers the ZRANGEBYLEX bounds of every key under folder key: from "key/"
// included to "key0" excluded ('0' follows '/'), or everything for the root.
func folderRange(key string) (lo, hi string) {
	if key == "" {
		return "-", "+"
	}
	return "[" + key + "/", "(" + key + "0"
}

func checkCertKey(key string) error {
	switch {
	case key == "":
		return errors.New("certificate storage: an empty key")
	case len(key) > maxCertKey:
		return fmt.Errorf("certificate storage: a key of %d bytes (at most %d)", len(key), maxCertKey)
	}
	return nil
}

var certStoreScript = redis.NewScript(`
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('ZADD', KEYS[3], 0, ARGV[1])
return 1
`)

// Store puts value at key, replacing what was there, with its modification time.
func (c *CertStorage) Store(ctx context.Context, key string, value []byte) error {
	if err := checkCertKey(key); err != nil {
		return err
	}
	if len(value) > MaxCertValue {
		return fmt.Errorf("certificate storage %q: a value of %d bytes (at most %d); certificates and keys are a few KiB", key, len(value), MaxCertValue)
	}
	if err := certStoreScript.Run(ctx, c.rdb, certKeys, key, value, c.now().UnixMilli()).Err(); err != nil {
		return fmt.Errorf("certificate storage: store %q: %w", key, err)
	}
	return nil
}

// Load answers the value at key, or an error that is fs.ErrNotExist when there is none.
func (c *CertStorage) Load(ctx context.Context, key string) ([]byte, error) {
	b, err := c.rdb.HGet(ctx, certFilesKey, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("certificate storage %q: %w", key, fs.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("certificate storage: load %q: %w", key, err)
	}
	return b, nil
}

// certDeleteScript deletes a key and every key under it as a folder, in chunks that Lua's
// unpack can take.
var certDeleteScript = redis.NewScript(`
local ks = redis.call('ZRANGEBYLEX', KEYS[3], ARGV[2], ARGV[3])
table.insert(ks, ARGV[1])
for i = 1, #ks, 500 do
  local chunk = {unpack(ks, i, math.min(i + 499, #ks))}
  redis.call('HDEL', KEYS[1], unpack(chunk))
  redis.call('HDEL', KEYS[2], unpack(chunk))
  redis.call('ZREM', KEYS[3], unpack(chunk))
end
return #ks
`)

// Delete removes key and, when key is a folder, everything under it. A missing key is not an
// error.
func (c *CertStorage) Delete(ctx context.Context, key string) error {
	if err := checkCertKey(key); err != nil {
		return err
	}
	lo, hi := folderRange(key)
	if err := certDeleteScript.Run(ctx, c.rdb, certKeys, key, lo, hi).Err(); err != nil {
		return fmt.Errorf("certificate storage: delete %q: %w", key, err)
	}
	return nil
}

// Exists answers whether key is stored or is a folder of stored keys (false on an error).
func (c *CertStorage) Exists(ctx context.Context, key string) bool {
	_, err := c.Stat(ctx, key)
	return err == nil
}

var certStatScript = redis.NewScript(`
local m = redis.call('HGET', KEYS[2], ARGV[1])
if m then return {1, redis.call('HSTRLEN', KEYS[1], ARGV[1]), m} end
if #redis.call('ZRANGEBYLEX', KEYS[3], ARGV[2], ARGV[3], 'LIMIT', 0, 1) > 0 then return {0} end
return {}
`)

// Stat describes key: a stored value (its size and modification time) or a folder. A key that
// is neither answers an error that is fs.ErrNotExist.
func (c *CertStorage) Stat(ctx context.Context, key string) (CertKeyInfo, error) {
	lo, hi := folderRange(key)
	res, err := certStatScript.Run(ctx, c.rdb, certKeys, key, lo, hi).Slice()
	if err != nil {
		return CertKeyInfo{}, fmt.Errorf("certificate storage: stat %q: %w", key, err)
	}
	switch {
	case len(res) == 0:
		return CertKeyInfo{}, fmt.Errorf("certificate storage %q: %w", key, fs.ErrNotExist)
	case len(res) == 1:
		return CertKeyInfo{Key: key}, nil
	}
	size, _ := res[1].(int64)
	ms, _ := res[2].(string)
	var modified time.Time
	if n, err := strconv.ParseInt(ms, 10, 64); err == nil {
		modified = time.UnixMilli(n)
	}
	return CertKeyInfo{Key: key, Modified: modified, Size: size, IsTerminal: true}, nil
}

// List answers the keys in folder prefix, sorted: its direct children (values and folders)
// or, when recursive, everything under it, folders included, as certmagic's FileStorage
// does. A prefix that is a stored value has no children; one that is nothing at all answers
// an error that is fs.ErrNotExist.
func (c *CertStorage) List(ctx context.Context, prefix string, recursive bool) ([]string, error) {
	lo, hi := folderRange(prefix)
	base := prefix
	if base != "" {
		base += "/"
	}
	seen := map[string]bool{}
	for {
		page, err := c.rdb.ZRangeArgs(ctx, redis.ZRangeArgs{Key: certIndexKey, Start: lo, Stop: hi, ByLex: true, Count: certListPage}).Result()
		if err != nil {
			return nil, fmt.Errorf("certificate storage: list %q: %w", prefix, err)
		}
		for _, key := range page {
			rest := strings.TrimPrefix(key, base)
			for i := 0; i <= len(rest); i++ {
				if i < len(rest) && rest[i] != '/' {
					continue
				}
				seen[base+rest[:i]] = true
				if !recursive {
					break
				}
			}
		}
		if len(page) < certListPage {
			break
		}
		lo = "(" + page[len(page)-1]
	}
	if len(seen) == 0 {
		if _, err := c.Stat(ctx, prefix); err != nil && prefix != "" {
			return nil, err
		}
		return nil, nil
	}
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys, nil
}

// heldCertLock is one lock this CertStorage holds: its token in Redis and the goroutine that
// renews its lease.
type heldCertLock struct {
	token string
	stop  chan struct{}
	done  chan struct{}
}

// Lock takes the lock name, waiting while another holds it, until ctx ends. While held, its
// lease is renewed every third of it; a holder that dies stops renewing, and the lock is free
// again one lease later.
func (c *CertStorage) Lock(ctx context.Context, name string) error {
	key := certLockKey(name)
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	token := hex.EncodeToString(b)
	wait := certLockPollMin
	for {
		ok, err := c.rdb.SetNX(ctx, key, token, c.lease).Result()
		if err != nil {
			return fmt.Errorf("certificate storage: lock %q: %w", name, err)
		}
		if ok {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("certificate storage: waiting for lock %q: %w", name, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(wait*2, certLockPollMax)
	}
	h := &heldCertLock{token: token, stop: make(chan struct{}), done: make(chan struct{})}
	c.mu.Lock()
	c.held[name] = h
	c.mu.Unlock()
	go c.renew(name, h)
	return nil
}

// renew extends h's lease until Unlock stops it, or until the lease is lost: another holder
// has the lock, or no renewal has succeeded for a whole lease (Redis unreachable), after which
// another may.
func (c *CertStorage) renew(name string, h *heldCertLock) {
	defer close(h.done)
	key := certLockKey(name)
	tick := time.NewTicker(c.lease / 3)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-h.stop:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), c.lease/3)
		n, err := renewScript.Run(ctx, c.rdb, []string{key}, h.token, c.lease.Milliseconds()).Int()
		cancel()
		switch {
		case err == nil && n == 1:
			last = time.Now()
			continue
		case err != nil && time.Since(last) < c.lease:
			continue // perhaps a blip: the lease still holds
		}
		c.mu.Lock()
		if c.held[name] == h {
			delete(c.held, name)
		}
		c.mu.Unlock()
		return
	}
}

// Unlock releases the lock name that Lock took. It answers an error when this storage does
// not hold it, or when its lease ran out before (another may have taken it meanwhile).
func (c *CertStorage) Unlock(ctx context.Context, name string) error {
	c.mu.Lock()
	h := c.held[name]
	delete(c.held, name)
	c.mu.Unlock()
	if h == nil {
		return fmt.Errorf("certificate storage: unlock %q: not held here (its lease may have run out)", name)
	}
	close(h.stop)
	<-h.done
	n, err := releaseScript.Run(ctx, c.rdb, []string{certLockKey(name)}, h.token).Int()
	if err != nil {
		return fmt.Errorf("certificate storage: unlock %q: %w", name, err)
	}
	if n == 0 {
		return fmt.Errorf("certificate storage: unlock %q: its lease (%v) had run out", name, c.lease)
	}
	return nil
}
