package gateway

import (
	"context"
	"crypto/subtle"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"wb/session"
	"wb/store"
)

// Metrics are the gateway's Prometheus metrics.
type Metrics struct {
	reg       *prometheus.Registry
	requests  *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	admission *prometheus.CounterVec
}

// NewMetrics registers the gateway's metrics, and a sessions-by-state gauge read from st
// at scrape time when st is not nil.
func NewMetrics(st *store.Store) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wb_http_requests_total", Help: "HTTP requests by route, method and status.",
		}, []string{"route", "method", "status"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "wb_http_request_duration_seconds", Help: "HTTP request latency by route, method and status.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"route", "method", "status"}),
		admission: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wb_admission_decisions_total", Help: "Admission outcomes: allow, warn, deny, invalid, rate_limited, concurrency_limited.",
		}, []string{"decision"}),
	}
	m.reg.MustRegister(m.requests, m.latency, m.admission,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	if st != nil {
		m.reg.MustRegister(&stateCollector{st: st, desc: prometheus.NewDesc("wb_sessions",
			"Sessions by state, across projects (terminal ones while retained).", []string{"state"}, nil)})
	}
	return m
}

// Registry lets other packages add their metrics to /metrics.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves /metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// metricsGuard lets only the operator read h: the admin key or the metrics token.
func (s *Server) metricsGuard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		tokenOK := s.MetricsToken != "" && subtle.ConstantTimeCompare([]byte(key), []byte(s.MetricsToken)) == 1
		if !tokenOK && !s.isAdmin(r) {
			s.writeError(w, r, &apiError{Status: 401, Type: "unauthenticated", Code: "unauthenticated",
				Message: "/metrics needs the admin key or the metrics token (Authorization: Bearer ...)"})
			return
		}
		h.ServeHTTP(w, r)
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = 200
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// instrument counts and times every request by its route pattern (not its path, so ids do
// not explode the label set), and turns a panic into a 500. A request its handler aborts
// (http.ErrAbortHandler: an answer that broke off, its caller gone) is counted too, under
// the status its caller got (0: none), before the abort goes on to net/http: those are the
// requests an operator most needs to see.
func (m *Metrics) instrument(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			v := recover()
			aborted := v == http.ErrAbortHandler
			if v != nil && !aborted && sw.status == 0 {
				writeJSON(sw, 500, errorBody{Error: apiError{Type: "api_error", Code: "internal", Message: "internal error"}})
			}
			route := r.Pattern // what mux matched, set on r as it routed it: no second lookup
			if route == "" || route == "/" {
				route = "unmatched"
			}
			status, method := strconv.Itoa(sw.status), methodLabel(r.Method)
			m.requests.WithLabelValues(route, method, status).Inc()
			m.latency.WithLabelValues(route, method, status).Observe(time.Since(start).Seconds())
			if aborted {
				panic(v)
			}
		}()
		mux.ServeHTTP(sw, r)
	})
}

// methodLabel is a request's method as a label: one of HTTP's, or "other", since a caller
// needs no key to send any method, and each would be a series (and a histogram's) of its own.
func methodLabel(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return method
	}
	return "other"
}

type stateCollector struct {
	st   *store.Store
	desc *prometheus.Desc
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	counts, err := c.st.CountByState(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	for _, s := range session.States() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts[s]), string(s))
	}
}
