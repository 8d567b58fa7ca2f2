package chvtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"wb/hypervisor/cloudhv/chspec"
	"wb/hypervisor/oci"
)

// Options configure one fake VMM.
type Options struct {
	// APISocket is the path of the API's Unix socket (CH's --api-socket path=...). Required.
	APISocket string
	// Events receives the event-monitor stream (CH's --event-monitor); nil: none.
	Events io.Writer
	// StateDir holds the guest's mounts, the runc state and bundles. Required, absolute, and
	// searchable (o+x) down from / (runc's guest root is an unprivileged host uid).
	StateDir string
	// Runc is the runc binary; default: runc on PATH.
	Runc string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// NestCgroup puts the guest's cgroup below the VMM process's own, so that what the guest
	// burns counts as the VMM's CPU and memory, as a real CH's guest (its vCPU threads) does.
	// fakech sets it; in library use the VMM is the test process, whose cgroup is left alone.
	NestCgroup bool
	// JoinTaps joins each net device whose tap exists in the VMM's network namespace to the
	// guest (net.go). fakech sets it: a driver starts it in the guest's own namespace. In
	// library use the VMM is the test process, in the host's namespace, whose taps are not
	// the fake's to take over.
	JoinTaps bool
}

// VMM is one fake Cloud Hypervisor process: an API server and at most one VM.
type VMM struct {
	opts     Options
	log      *slog.Logger
	checker  *chspec.Checker
	events   *eventMonitor
	drv      *oci.Driver // made at the first boot (see guestDriver); guarded by mu
	runc     string
	runcRoot string

	badResponses atomic.Int64
	exit         chan struct{} // closed when the VMM shuts down (vmm.shutdown, guest power-off)
	exitOnce     sync.Once

	mu  sync.Mutex
	cfg *vmConfig   // nil: no VM created
	vm  *vmInstance // nil: not booted (CH's VmOwnership::None)
}

// New checks the options and prepares the state dir.
func New(o Options) (*VMM, error) {
	if o.APISocket == "" {
		return nil, errors.New("chvtest: Options.APISocket is required (--api-socket path=...)")
	}
	if o.StateDir == "" || !filepath.IsAbs(o.StateDir) {
		return nil, fmt.Errorf("chvtest: Options.StateDir must be an absolute path, got %q", o.StateDir)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Runc == "" {
		p, err := exec.LookPath("runc")
		if err != nil {
			return nil, fmt.Errorf("chvtest: runc not found on PATH (apt-get install runc, or set the runc binary): %w", err)
		}
		o.Runc = p
	}
	if err := os.MkdirAll(o.StateDir, 0o755); err != nil {
		return nil, fmt.Errorf("chvtest: state dir: %w", err)
	}
	checker, err := chspec.NewChecker()
	if err != nil {
		return nil, err
	}
	v := &VMM{opts: o, log: o.Logger.With("component", "fakech"), checker: checker, runc: o.Runc,
		runcRoot: filepath.Join(o.StateDir, "runc"), exit: make(chan struct{})}
	return v, nil
}

// guestDriver is the runc driver of the guest, made at the first boot: by then whoever
// started the VMM has put it in its cgroup, below which a nesting VMM puts its guest's.
// The caller holds v.mu.
func (v *VMM) guestDriver() (*oci.Driver, error) {
	if v.drv != nil {
		return v.drv, nil
	}
	parent := "/wb-fakech-" + randomID()
	if v.opts.NestCgroup {
		own, err := nestCgroup(v.log)
		if err != nil {
			return nil, err
		}
		parent = strings.TrimSuffix(own, "/") + parent
	}
	drv, err := oci.New(oci.Options{Runtime: oci.RuntimeRunc, RuntimePath: v.runc, StateRoot: v.runcRoot,
		BundleRoot: filepath.Join(v.opts.StateDir, "bundles"), CgroupParent: parent, Logger: v.log})
	if err != nil {
		return nil, fmt.Errorf("chvtest: %w", err)
	}
	v.drv = drv
	return drv, nil
}

// Run serves one VMM until ctx ends or the VMM shuts down.
func Run(ctx context.Context, o Options) error {
	v, err := New(o)
	if err != nil {
		return err
	}
	return v.Serve(ctx)
}

// BadResponses counts the answers the fake sent that its own checker rejected: each is a
// bug of the fake (logged at error level). Tests assert it stays 0.
func (v *VMM) BadResponses() int64 { return v.badResponses.Load() }

// Serve listens on the API socket and serves until ctx ends (then it shuts the VMM down as
// CH does on SIGTERM) or a vmm.shutdown / guest power-off ends the VMM.
func (v *VMM) Serve(ctx context.Context) error {
	// The guest's init is orphaned by "runc create"; as child subreaper the VMM inherits it
	// and can read its exit status (a power-off or a panic, see doc.go).
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		v.log.Warn("cannot become child subreaper: a guest's exit status will be unknown", "err", err)
	}
	v.events = newEventMonitor(v.opts.Events, v.log)
	v.events.emit("vmm", "starting", nil)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: v.opts.APISocket, Net: "unix"})
	if err != nil {
		v.events.close(time.Second)
		return fmt.Errorf("chvtest: api socket: %w", err)
	}
	ln.SetUnlinkOnClose(true)
	srv := &http.Server{Handler: http.HandlerFunc(v.serveHTTP), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
		v.mu.Lock()
		if err := v.vmmShutdown(context.Background()); err != nil {
			v.log.Error("shutdown on cancel", "err", err)
		}
		v.mu.Unlock()
	case <-v.exit:
	case err := <-served:
		v.shutdownGuest()
		v.events.close(5 * time.Second)
		return fmt.Errorf("chvtest: serve: %w", err)
	}
	// Let the answer to vmm.shutdown go out before the socket closes.
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	v.shutdownGuest()
	v.mu.Lock()
	if v.drv != nil {
		if err := v.drv.RemoveCgroupParent(); err != nil {
			v.log.Debug("remove cgroup parent", "err", err)
		}
	}
	v.mu.Unlock()
	v.events.close(5 * time.Second)
	return nil
}

// shutdownGuest makes sure no guest outlives the VMM.
func (v *VMM) shutdownGuest() {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.vm != nil {
		v.vm.teardown(context.Background())
		v.vm = nil
	}
}

func (v *VMM) exitVMM() { v.exitOnce.Do(func() { close(v.exit) }) }

// apiResponse is an answer before it is checked and written.
type apiResponse struct {
	status int
	body   []byte
}

func noContent() apiResponse { return apiResponse{status: http.StatusNoContent} }

// errorChain is CH's error answer: the error's chain of messages, outermost first.
func errorChain(status int, chain ...string) apiResponse {
	b, _ := jsonMarshal(chain)
	return apiResponse{status: status, body: b}
}

// apiError is an error of the VMM's API layer (ApiError + VmError in CH): the HTTP status
// it maps to and its chain after "Error from API".
type apiError struct {
	status int
	chain  []string
}

func (e *apiError) Error() string { return strings.Join(e.chain, ": ") }

func (e *apiError) response() apiResponse {
	return errorChain(e.status, append([]string{"Error from API"}, e.chain...)...)
}

const maxBody = 4 << 20 // CH's HTTP_PAYLOAD_MAX_SIZE

func (v *VMM) serveHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil || len(body) > maxBody {
		v.write(w, r, apiResponse{status: http.StatusBadRequest})
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	v.write(w, r, v.dispatch(r, body))
}

// dispatch routes as CH's http module does: an unknown path is 404 ["Not Found"], a method
// an endpoint does not take is 400; then the request is checked against the document.
func (v *VMM) dispatch(r *http.Request, body []byte) apiResponse {
	op, ok := strings.CutPrefix(r.URL.Path, chspec.BasePath+"/")
	ep, known := endpoints[op]
	if !ok || !known {
		return errorChain(http.StatusNotFound, "Not Found")
	}
	if r.Method != ep.method {
		if ep.bareBadMethod && r.Method != http.MethodPut && r.Method != http.MethodGet {
			return apiResponse{status: http.StatusBadRequest}
		}
		return errorChain(http.StatusBadRequest, "Bad Request")
	}
	if ep.needsBody && len(body) == 0 {
		return apiResponse{status: http.StatusBadRequest} // CH: no body, a bare 400
	}
	// A body that is not a JSON object gets CH's own answer (serde's "Failed to deserialize
	// JSON") from the handler; the document's check is for what CH would parse.
	if trimmed := bytes.TrimSpace(body); len(trimmed) == 0 || trimmed[0] == '{' && json.Valid(trimmed) {
		if err := v.checker.CheckRequest(r); err != nil {
			return errorChain(http.StatusBadRequest, "Bad Request", err.Error())
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	return ep.handle(v, r.Context(), body)
}

// write checks the answer against the document, then sends it. An answer the document does
// not allow is a bug of the fake: logged loudly and counted (BadResponses), but sent as is so
// that the client's tests see it too.
func (v *VMM) write(w http.ResponseWriter, r *http.Request, a apiResponse) {
	resp := &http.Response{StatusCode: a.status, Header: http.Header{}, Body: io.NopCloser(bytes.NewReader(a.body))}
	resp.Header.Set("Content-Type", "application/json")
	if err := v.checker.CheckResponse(r, resp); err != nil {
		v.badResponses.Add(1)
		v.log.Error("BUG: the fake's answer does not match cloud-hypervisor.yaml", "method", r.Method, "path", r.URL.Path, "status", a.status, "err", err)
	}
	w.Header().Set("Server", "Cloud Hypervisor API")
	w.Header().Set("Content-Type", "application/json")
	if a.status == http.StatusNoContent {
		w.WriteHeader(a.status)
		return
	}
	w.Header().Set("Content-Length", fmt.Sprint(len(a.body)))
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body)
}

// endpoint is one route of CH's API.
type endpoint struct {
	method        string
	needsBody     bool
	bareBadMethod bool // other methods than GET/PUT get a bare 400 (CH's generic handler)
	handle        func(v *VMM, ctx context.Context, body []byte) apiResponse
}

var endpoints = map[string]endpoint{
	"vmm.ping":     {method: http.MethodGet, bareBadMethod: true, handle: (*VMM).apiPing},
	"vmm.shutdown": {method: http.MethodPut, handle: (*VMM).apiVmmShutdown},
	"vm.create":    {method: http.MethodPut, needsBody: true, handle: (*VMM).apiCreate},
	"vm.boot":      {method: http.MethodPut, bareBadMethod: true, handle: (*VMM).apiBoot},
	"vm.pause":     {method: http.MethodPut, bareBadMethod: true, handle: (*VMM).apiPause},
	"vm.resume":    {method: http.MethodPut, bareBadMethod: true, handle: (*VMM).apiResume},
	"vm.shutdown":  {method: http.MethodPut, bareBadMethod: true, handle: (*VMM).apiShutdown},
	"vm.delete":    {method: http.MethodPut, bareBadMethod: true, handle: (*VMM).apiDelete},
	"vm.info":      {method: http.MethodGet, bareBadMethod: true, handle: (*VMM).apiInfo},
	"vm.counters":  {method: http.MethodGet, bareBadMethod: true, handle: (*VMM).apiCounters},
	"vm.resize":    {method: http.MethodPut, needsBody: true, bareBadMethod: true, handle: (*VMM).apiResize},
	"vm.add-vsock": {method: http.MethodPut, needsBody: true, bareBadMethod: true, handle: (*VMM).apiAddVsock},
	"vm.add-net":   {method: http.MethodPut, needsBody: true, bareBadMethod: true, handle: (*VMM).apiAddNet},
	"vm.snapshot":  {method: http.MethodPut, needsBody: true, bareBadMethod: true, handle: (*VMM).apiSnapshot},
	"vm.restore":   {method: http.MethodPut, needsBody: true, bareBadMethod: true, handle: (*VMM).apiRestore},
}
