package node

import (
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"wb/node/nodeapi"
	"wb/session"
)

// Metrics are a node's Prometheus metrics, in a registry of their own: its sessions' guests
// by state, and the exec, PTY and file requests to its guests' agents (execs under way,
// requests by outcome), through its API or in process (Local: the edge's data path the node
// serves). A nil *Metrics counts nothing. Safe for concurrent use.
type Metrics struct {
	reg      *prometheus.Registry
	execs    prometheus.Gauge
	requests *prometheus.CounterVec
	lost     *prometheus.CounterVec
	ends     *prometheus.CounterVec
	// hostTasks: see hostTasksAction.
	hostTasks *prometheus.CounterVec
}

// NewMetrics makes the metrics, of no node yet (Config.Metrics: New adds its guests).
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		execs: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "wb_node_execs_in_progress",
			Help: "Execs in the node's guests whose answer is under way, through the node's API or the edge's data path it serves.",
		}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wb_node_agent_requests_total",
			Help: "Requests to the node's guests' agents, through its API or the edge's data path it serves, by kind (exec, pty, files, other) and outcome: ok (answered below 400, a PTY upgraded), refused (403: the runtime policy refused or killed), rejected (another 4xx: no such guest, its state, a bad request), failed (5xx: the guest's agent did not answer, or answered what the node does not pass on). An exec whose answer the node ended with its own error line counts by that line's status.",
		}, []string{"kind", "outcome"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wb_node_checkpoint_stopped_guests_total",
			Help: "Memory snapshots whose checkpoint failed and stopped the guest (the snapshot failed), by what became of the session: restarted (a new guest booted from the old one's disk: files kept, processes lost) or failed (its disk could not be used either: the session failed, guest_crash). The node's log says why the checkpoint failed.",
		}, []string{"outcome"}),
		ends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wb_node_guest_process_ends_total",
			Help: "Requests of the node that a guest's agent end every process of its guest, made as the guest's sandbox neared its host process limit (runsc: its host tasks grow with the guest's processes' churn, and the sandbox dies at that limit), by outcome: ended (the agent ended them), failed (it did not answer, or answered an error: asked again should the count grow on), unsupported (it cannot, an older agent: not asked again, the session runs on), paused (the session was paused meanwhile: the request was given up, a frozen agent answers nothing), stopped (a direct guest, a tier-1 run's, which has no agent: the guest was stopped, and its run answers 137). The node's log says which session and how near.",
		}, []string{"outcome"}),
		hostTasks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wb_node_host_process_total_actions_total",
			Help: "Actions of the node on its guest that held the most of the host's guests' process total (the pids.max of their common cgroup) when they held 85% of it or more, by outcome: ended (its agent ended its processes and its count fell), stopped (its count did not fall, a runsc sandbox's: the session failed, policy_violation, rule host_process_share) or gone (it ended meanwhile: its session's end, its sandbox's death). The node's log says which session and how many.",
		}, []string{"outcome"}),
	}
	m.reg.MustRegister(m.execs, m.requests, m.lost, m.ends, m.hostTasks, prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}

// Registry lets other packages add their metrics to the node's (its TLS files').
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves /metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// watch adds n's guests to the metrics.
func (m *Metrics) watch(n *Node) error {
	if m == nil {
		return nil
	}
	c := &guestCollector{n: n, desc: prometheus.NewDesc("wb_node_guests",
		"The node's sessions' guests by state and runtime (the back end's); busy: an operation on the guest held it at the scrape.",
		[]string{"state", "runtime"}, nil)}
	if err := m.reg.Register(c); err != nil {
		return fmt.Errorf("node: metrics: %w", err)
	}
	return nil
}

// execStarted counts an exec under way until the func it answers is called.
func (m *Metrics) execStarted() func() {
	if m == nil {
		return func() {}
	}
	m.execs.Inc()
	return m.execs.Dec
}

// agentRequest counts a request to a guest's agent of kind, answered status (0: none
// written, which the server sends as a 200; a PTY's upgrade writes none either).
func (m *Metrics) agentRequest(kind string, status int) {
	if m == nil {
		return
	}
	outcome := "ok"
	switch {
	case status == http.StatusForbidden:
		// The agent's own 403s reach no caller (fromGuest): a 403 is the node's policy.
		outcome = "refused"
	case status >= 500:
		outcome = "failed"
	case status >= 400:
		outcome = "rejected"
	}
	m.requests.WithLabelValues(kind, outcome).Inc()
}

// checkpointLost counts a memory snapshot whose failed checkpoint stopped the guest, whose
// session was restarted from its disk or failed.
func (m *Metrics) checkpointLost(restarted bool) {
	if m == nil {
		return
	}
	outcome := "failed"
	if restarted {
		outcome = "restarted"
	}
	m.lost.WithLabelValues(outcome).Inc()
}

// guestProcsEnded counts a request that a guest's agent end its processes, by outcome.
func (m *Metrics) guestProcsEnded(outcome string) {
	if m == nil {
		return
	}
	m.ends.WithLabelValues(outcome).Inc()
}

// agentKind is the kind of a request to a guest's agent, by its agent path (agentPath).
func agentKind(method, sub string) string {
	switch {
	case method == http.MethodPost && sub == "/v1/exec":
		return nodeapi.AgentKindExec
	case method == http.MethodGet && sub == "/v1/pty":
		return nodeapi.AgentKindPTY
	case sub == "/v1/files":
		return nodeapi.AgentKindFiles
	}
	return nodeapi.AgentKindOther
}

// guestCollector reports the node's guests by state at scrape time.
type guestCollector struct {
	n    *Node
	desc *prometheus.Desc
}

func (c *guestCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *guestCollector) Collect(ch chan<- prometheus.Metric) {
	counts := map[string]int{}
	for _, l := range c.n.all() {
		// A scrape waits on no operation (a snapshot holds its guest for seconds).
		if !l.mu.TryLock() {
			counts["busy"]++
			continue
		}
		counts[string(l.g.State)]++
		l.mu.Unlock()
	}
	// Every state is reported, 0 where the node has no guest in it: a series that went away
	// when the last guest left its state would read as no data, not as none.
	runtime := c.n.Driver.Name()
	for _, state := range session.States() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts[string(state)]), string(state), runtime)
		delete(counts, string(state))
	}
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts["busy"]), "busy", runtime)
	delete(counts, "busy")
	for state, k := range counts { // a state of none of the above (a journal's, unknown)
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(k), state, runtime)
	}
}

// statusWriter keeps the status of the answer written through it.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	if w.status == 0 && status >= 200 { // not an informational 1xx

		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController (the proxy's flushes, a PTY's hijack) reach the
// server's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
