package mtls

import (
	"crypto/x509"
	"encoding/pem"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the Prometheus metrics of the Servers and Dialers whose Files name it: when
// the certificates they hold expire, and how many times their files changed but did not
// load. Register it in a registry (it is a prometheus.Collector). Safe for concurrent use.
type Metrics struct {
	expiry   *prometheus.Desc
	failures *prometheus.CounterVec

	mu sync.Mutex
	rs []*reloading
}

// NewMetrics makes the metrics, of no Server or Dialer yet.
func NewMetrics() *Metrics {
	return &Metrics{
		expiry: prometheus.NewDesc("wb_tls_cert_expiry_timestamp_seconds",
			"The earliest NotAfter (Unix seconds) of the certificates loaded from a member's TLS files: its certificate chain and its CA; the earliest of its servers and dialers, by the flag of the certificate.",
			[]string{"cert"}, nil),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wb_tls_reload_failures_total",
			Help: "Changes of a member's TLS files that did not load (the last good ones stayed in use), by the flag of the certificate.",
		}, []string{"cert"}),
	}
}

// add has m report r, and counts its failures from 0.
func (m *Metrics) add(r *reloading) {
	m.failures.WithLabelValues(r.files.CertFlag)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rs = append(m.rs, r)
}

// Describe is prometheus.Collector's.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.expiry
	m.failures.Describe(ch)
}

// Collect is prometheus.Collector's. Each set of files is looked at first, and read again
// if it changed, so that a scrape sees a rotation (or a failed one) before a handshake does.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	rs := append([]*reloading(nil), m.rs...)
	m.mu.Unlock()
	earliest := map[string]time.Time{}
	for _, r := range rs {
		r.current()
		r.mu.Lock()
		na := r.notAfter
		r.mu.Unlock()
		if e, ok := earliest[r.files.CertFlag]; !ok || na.Before(e) {
			earliest[r.files.CertFlag] = na
		}
	}
	for flag, na := range earliest {
		ch <- prometheus.MustNewConstMetric(m.expiry, prometheus.GaugeValue, float64(na.Unix()), flag)
	}
	m.failures.Collect(ch)
}

// earliestNotAfter answers the earliest NotAfter of the chain's certificates (DER) and of the
// CA file's (PEM); the zero time when none parses.
func earliestNotAfter(chain [][]byte, caPEM []byte) time.Time {
	var earliest time.Time
	see := func(der []byte) {
		c, err := x509.ParseCertificate(der)
		if err == nil && (earliest.IsZero() || c.NotAfter.Before(earliest)) {
			earliest = c.NotAfter
		}
	}
	for _, der := range chain {
		see(der)
	}
	for rest := caPEM; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if b.Type == "CERTIFICATE" {
			see(b.Bytes)
		}
	}
	return earliest
}
