package webhooks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"wb/internal/netguard"
	"wb/internal/redistest"
	"wb/session"
	"wb/store"
)

// scriptedResolver answers each name from a list of answers, one per lookup (the last
// repeats); it never sends a packet.
type scriptedResolver struct {
	mu      sync.Mutex
	answers map[string][][]netip.Addr
	lookups map[string]int
}

func (r *scriptedResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	as, ok := r.answers[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	i := min(r.lookups[host], len(as)-1)
	r.lookups[host]++
	return as[i], nil
}

// refusingDialer fails the test if anything is dialled.
type refusingDialer struct{ t *testing.T }

func (d refusingDialer) DialContext(_ context.Context, network, address string) (net.Conn, error) {
	d.t.Errorf("dialled %s %s", network, address)
	return nil, errors.New("test: no dialling")
}

func ips(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

// TestRegistrationRefusesNonPublic: without AllowPrivate, a URL whose host is, or resolves
// to, any address wb does not connect to is refused at registration with a field error on
// url; a public one is registered.
func TestRegistrationRefusesNonPublic(t *testing.T) {
	rdb := redistest.Server(t)
	ctx := context.Background()
	res := &scriptedResolver{lookups: map[string]int{}, answers: map[string][][]netip.Addr{
		"hooks.test":    {ips("93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c")},
		"internal.test": {ips("10.0.0.5")},
		"mixed.test":    {ips("93.184.215.14", "127.0.0.1")},
		"meta.test":     {ips("169.254.169.254")},
	}}
	guard, err := netguard.New(netguard.Options{Resolver: res, Dialer: refusingDialer{t}})
	if err != nil {
		t.Fatal(err)
	}
	reg := NewRegistry(rdb, RegistryOptions{Guard: guard})
	for _, u := range []string{
		"http://127.0.0.1:22/", "http://[::1]/", "http://[::ffff:127.0.0.1]/", "http://0x7f000001/", "http://2130706433/",
		"http://127.1/", "http://localhost:8080/", "https://LOCALHOST./", "http://169.254.169.254/latest/", "http://0xa9fea9fe/",
		"http://10.0.0.1/", "http://192.168.1.1/", "http://[fd00::1]/", "http://internal.test/", "http://mixed.test/",
		"http://meta.test/", "http://nxdomain.test/", "http://1.2.3.256/",
	} {
		_, err := reg.Create(ctx, "proj_guard", u, []string{AllEvents})
		var fe *session.FieldError
		if !errors.As(err, &fe) || fe.Field != "url" {
			t.Errorf("%s: %v; want a field error on url", u, err)
		}
	}
	if _, err := reg.Create(ctx, "proj_guard", "https://hooks.test/wb", []string{AllEvents}); err != nil {
		t.Fatalf("a public URL: %v", err)
	}
	// The default registry (the system resolver) refuses loopback without a lookup.
	_, err = NewRegistry(rdb).Create(ctx, "proj_guard", "http://127.0.0.1:22/", []string{AllEvents})
	if fe := (*session.FieldError)(nil); !errors.As(err, &fe) || fe.Field != "url" || !strings.Contains(err.Error(), "--allow-private-webhooks") {
		t.Fatalf("the default registry: %v", err)
	}
}

// TestDeliveryRefusesRebinding: a host that resolved to a public address at registration
// and to loopback at delivery is refused at delivery: the receiver on loopback gets nothing,
// and the delivery log says why.
func TestDeliveryRefusesRebinding(t *testing.T) {
	rdb := redistest.Server(t)
	ctx := context.Background()
	st := store.New(rdb)
	project := newProject(t, st, rdb, "rebind")
	rcv := newReceiver(t, nil)
	_, port, _ := net.SplitHostPort(rcv.srv.Listener.Addr().String())
	res := &scriptedResolver{lookups: map[string]int{}, answers: map[string][][]netip.Addr{
		"hook.test": {ips("93.184.215.14"), ips("127.0.0.1")},
	}}
	guard, err := netguard.New(netguard.Options{Resolver: res, Dialer: refusingDialer{t}})
	if err != nil {
		t.Fatal(err)
	}
	reg := NewRegistry(rdb, RegistryOptions{Guard: guard})
	ep, err := reg.Create(ctx, project, (&url.URL{Scheme: "http", Host: "hook.test:" + port, Path: "/hook"}).String(), []string{AllEvents})
	if err != nil {
		t.Fatal(err)
	}
	d := NewDispatcher(rdb, reg, fastOptions("rebind"))
	dctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(dctx) }()
	t.Cleanup(func() { cancel(); <-done })
	runSessions(t, st, project, 1)
	var log []Delivery
	waitFor(t, "a failed delivery", func() bool {
		log, _, err = reg.Deliveries(ctx, project, ep.ID, 10, "")
		return err == nil && len(log) > 0
	})
	if log[0].Status == StatusSucceeded || log[0].Error == nil || !strings.Contains(*log[0].Error, "127.0.0.1") || !strings.Contains(*log[0].Error, "loopback") {
		t.Fatalf("delivery %+v; want a failure naming the loopback address", log[0])
	}
	if n := len(rcv.all()); n != 0 {
		t.Fatalf("the loopback receiver got %d request(s)", n)
	}
}

// TestHugeResponseHeaderFails: an endpoint that answers more than
// netguard.MaxResponseHeaderBytes of headers has its delivery fail, not succeed, through the
// guarded transport (loopback opened by an allow prefix) and the allow-private one alike.
func TestHugeResponseHeaderFails(t *testing.T) {
	rdb := redistest.Server(t)
	ctx := context.Background()
	st := store.New(rdb)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Big", strings.Repeat("a", 2*netguard.MaxResponseHeaderBytes))
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	guard, err := netguard.New(netguard.Options{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	if err != nil {
		t.Fatal(err)
	}
	for name, ro := range map[string]RegistryOptions{"guarded": {Guard: guard}, "allow-private": {AllowPrivate: true}} {
		t.Run(name, func(t *testing.T) {
			project := newBareProject(t, st, name)
			reg := NewRegistry(rdb, ro)
			ep, err := reg.Create(ctx, project, srv.URL+"/hook", []string{AllEvents})
			if err != nil {
				t.Fatal(err)
			}
			stop := runDispatcher(t, NewDispatcher(rdb, reg, fastOptions(name)))
			defer stop()
			runSessions(t, st, project, 1)
			var log []Delivery
			waitFor(t, "a delivery", func() bool {
				log, _, err = reg.Deliveries(ctx, project, ep.ID, 10, "")
				return err == nil && len(log) > 0
			})
			d := log[len(log)-1]
			if d.Status == StatusSucceeded || d.Error == nil || !strings.Contains(*d.Error, "header") {
				t.Fatalf("delivery %+v; want a failure about the response headers", d)
			}
		})
	}
}

// TestCreateAsKeepsTheEndpoint: a create under an id that an endpoint has already (a retry of
// a create whose answer was lost) answers that endpoint with its secret, adds none, and is
// not refused for the project's cap, which that endpoint fills.
func TestCreateAsKeepsTheEndpoint(t *testing.T) {
	rdb := redistest.Server(t)
	ctx := context.Background()
	reg := NewRegistry(rdb, RegistryOptions{AllowPrivate: true, MaxEndpoints: 1})
	first, err := reg.CreateAs(ctx, "proj_as", EndpointPrefix+"retried", "http://127.0.0.1:9/a", []string{AllEvents})
	if err != nil {
		t.Fatal(err)
	}
	again, err := reg.CreateAs(ctx, "proj_as", first.ID, "http://127.0.0.1:9/a", []string{AllEvents})
	if err != nil || again.ID != first.ID || again.Secret != first.Secret {
		t.Fatalf("the retry answered %s (same secret: %v), %v; want %s with its secret", again.ID, again.Secret == first.Secret, err, first.ID)
	}
	if all, err := reg.List(ctx, "proj_as"); err != nil || len(all) != 1 {
		t.Fatalf("%d endpoints after the retry (%v), want 1", len(all), err)
	}
}

// TestEndpointCap: a project has at most MaxEndpoints endpoints; past it, a conflict that
// says what to do; deleting one makes room.
func TestEndpointCap(t *testing.T) {
	rdb := redistest.Server(t)
	ctx := context.Background()
	reg := NewRegistry(rdb, RegistryOptions{AllowPrivate: true, MaxEndpoints: 3})
	var ids []string
	for i := range 3 {
		e, err := reg.Create(ctx, "proj_cap", fmt.Sprintf("http://127.0.0.1:9/%d", i), []string{AllEvents})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, e.ID)
	}
	_, err := reg.Create(ctx, "proj_cap", "http://127.0.0.1:9/x", []string{AllEvents})
	var ce *store.ConflictError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "3 webhook endpoints") {
		t.Fatalf("a 4th endpoint: %v", err)
	}
	if _, err := reg.Create(ctx, "proj_other", "http://127.0.0.1:9/x", []string{AllEvents}); err != nil {
		t.Fatalf("another project: %v", err)
	}
	if err := reg.Delete(ctx, "proj_cap", ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Create(ctx, "proj_cap", "http://127.0.0.1:9/x", []string{AllEvents}); err != nil {
		t.Fatalf("after a delete: %v", err)
	}
	if NewRegistry(rdb).maxEndpoints != DefaultMaxEndpoints {
		t.Fatal("the default cap")
	}
}

// TestFairConcurrency: a project whose endpoint hangs cannot take every delivery slot:
// another project's deliveries start at once, long before the hung ones time out.
func TestFairConcurrency(t *testing.T) {
	rdb := redistest.Server(t)
	ctx := context.Background()
	st := store.New(rdb)
	reg := NewRegistry(rdb, RegistryOptions{AllowPrivate: true})

	release := make(chan struct{})
	var hanging atomic.Int32
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hanging.Add(1)
		defer hanging.Add(-1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(release); slow.Close() })
	hog := newProject(t, st, rdb, "hog")
	if _, err := reg.Create(ctx, hog, slow.URL+"/hook", []string{AllEvents}); err != nil {
		t.Fatal(err)
	}
	opts := fastOptions("fair")
	opts.Concurrency = 4
	opts.Timeout = 60 * time.Second // the hung deliveries hold their slots for the whole test
	d := NewDispatcher(rdb, reg, opts)
	dctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(dctx) }()
	t.Cleanup(func() { cancel(); <-done })
	runSessions(t, st, hog, 8) // 8 queues, every head hangs
	waitFor(t, "the hog's deliveries to hang", func() bool { return hanging.Load() >= 2 })

	polite := newProject(t, st, rdb, "polite")
	rcv := newReceiver(t, nil)
	createEndpoint(t, reg, polite, rcv, AllEvents)
	start := time.Now()
	runSessions(t, st, polite, 1)
	waitFor(t, "the polite project's deliveries", func() bool { return len(rcv.succeeded()) >= len(publicLifecycle) })
	if took := time.Since(start); took > 15*time.Second {
		t.Fatalf("the polite project waited %v", took)
	}
	if n := hanging.Load(); n > 3 {
		t.Fatalf("the hog holds %d of 4 slots", n)
	}
}
