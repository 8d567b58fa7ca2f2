package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redisconn"
)

// dialRedis builds a client for redis://[user:pass@]host:port/db or rediss://… (TLS), or a
// Cluster client when the host part lists several comma-separated addresses
// (redis://user:pass@h1:p1,h2:p2,h3:p3).
func dialRedis(rawURL, caFile string) (redis.UniversalClient, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, errors.New("not a URL: use redis://[user:password@]host:port/0 or rediss:// for TLS")
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return nil, fmt.Errorf("scheme %q: use redis://[user:password@]host:port/0, or rediss:// for TLS", u.Scheme)
	}
	var roots *x509.CertPool
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("--redis-ca: %w", err)
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--redis-ca %s: no PEM certificate in it", caFile)
		}
		if u.Scheme != "rediss" {
			return nil, errors.New("--redis-ca is given but the URL is redis://; use rediss:// for TLS")
		}
	}
	withRoots := func(c *tls.Config) {
		if c != nil && roots != nil {
			c.RootCAs = roots
		}
	}
	if hosts := strings.Split(u.Host, ","); len(hosts) > 1 {
		// One URL per the Cluster client's form: the first seed in the host, the rest as addr.
		cu := *u
		cu.Host, cu.Path = hosts[0], ""
		q := cu.Query()
		for _, h := range hosts[1:] {
			q.Add("addr", h)
		}
		cu.RawQuery = q.Encode()
		opts, err := redis.ParseClusterURL(cu.String())
		if err != nil {
			return nil, err
		}
		withRoots(opts.TLSConfig)
		if opts.TLSConfig == nil {
			opts.Dialer = redisconn.Dialer(opts.DialTimeout)
		}
		opts.ClusterStateReloadInterval = clusterReloadInterval
		return redis.NewClusterClient(opts), nil
	}
	opts, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	withRoots(opts.TLSConfig)
	if opts.TLSConfig == nil { // a TLS connection is opaque to go-redis already
		opts.Dialer = redisconn.Dialer(opts.DialTimeout)
	}
	return redis.NewClient(opts), nil
}

// clusterReloadInterval is how often a Cluster client reloads the slot map. go-redis learns
// a new one from a MOVED answer or every ClusterStateReloadInterval (60 s by default); a
// primary killed and replaced by its replica answers no MOVED (it answers nothing), so every
// write to its slots failed for up to a minute after the takeover (conformance/chaos). A
// reload is one CLUSTER SLOTS, in the background, at most once per interval.
const clusterReloadInterval = time.Second

// redisLabel is the Redis URL as logs and errors show it: the password never appears.
func redisLabel(rawURL string) string {
	if rawURL == "" {
		return "embedded"
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
