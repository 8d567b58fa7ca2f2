package sdk

// Decision points.
const (
	PointAdmission = "admission"
	PointRuntime   = "runtime"
	PointSpend     = "spend"
)

// Input is what the host passes to one decision. Which fields are set depends on Point (see
// plugins/ABI.md): admission sets Request, Plan and ActiveSessions; runtime sets Session and
// Event; spend sets Spend and, when the spend is one session's, Session. Fields the input does
// not carry are zero (Session.ID == "" when there is no session).
type Input struct {
	Point     string
	ProjectID string
	AtMs      int64 // when the host asked, milliseconds since the Unix epoch (0 if not given)

	Request        Request // admission
	Plan           Plan    // admission
	ActiveSessions int64   // admission: the project's live sessions, before this one

	Session Session // runtime, spend
	Event   Event   // runtime
	Spend   Spend   // spend

	// Raw is the input's JSON as the host wrote it, for fields this SDK does not decode. Do not
	// modify it: the decoded strings share its memory.
	Raw []byte
}

// Request is the create request being admitted (POST /v1/sessions). Absent numbers are nil.
type Request struct {
	Tier         *int
	Template     string
	Region       string
	Resources    *ResourceRequest
	IdleTimeoutS *int
	MaxLifetimeS *int
	EndUserID    string
	PolicyID     string
	VolumeID     string
	RestoreFrom  string
	Metadata     map[string]string
}

// ResourceRequest is the request's optional resources.
type ResourceRequest struct {
	SizeClass string
	VCPU      *int
	MemoryMiB *int
	DiskGiB   *int
}

// Plan is what the project may use.
type Plan struct {
	Concurrency int
	RatePerSec  int
}

// Session is the subset of the session object the SDK decodes (the rest is in Input.Raw).
type Session struct {
	ID        string
	State     string
	Tier      int
	Template  string
	Region    string
	EndUserID string
	Resources Resources
	Usage     Usage
	Metadata  map[string]string
}

// Resources are a session's resolved resources.
type Resources struct {
	VCPU      int
	MemoryMiB int
	DiskGiB   int
	SizeClass string
}

// Usage is a session's usage to date.
type Usage struct {
	SessionS    int64
	CPUMs       int64
	MemGiBMs    int64
	EgressBytes int64
}

// Event is what happened in a running guest (runtime point).
type Event struct {
	Type string
	AtMs int64
	Data map[string]any // JSON values: string, float64, bool, nil, []any, map[string]any
}

// Spend is a spend figure crossing a cap (spend point).
type Spend struct {
	Scope         string // project | end_user
	EndUserID     string
	Level         string // soft | hard
	SpendMicroUSD int64
	CapMicroUSD   int64
	Month         string // YYYY-MM
}

// Decision is a plugin's answer. Patch (admission only) is a JSON merge patch (RFC 7386) on the
// create request: {"tier": 1} lowers the tier, {"metadata": {"team": "core"}} adds a key. Its
// values may be string, bool, nil, any integer or float type, []any, []string,
// map[string]any and map[string]string.
type Decision struct {
	Allow    bool
	Reasons  []string
	Warnings []string
	Patch    map[string]any
}

// Allow answers yes.
func Allow() Decision { return Decision{Allow: true} }

// Deny answers no, with the reasons that the caller will see.
func Deny(reasons ...string) Decision { return Decision{Reasons: reasons} }

// Warn adds a warning.
func (d Decision) Warn(msg string) Decision {
	d.Warnings = append(d.Warnings, msg)
	return d
}

// WithPatch sets one top-level key of the patch.
func (d Decision) WithPatch(key string, v any) Decision {
	if d.Patch == nil {
		d.Patch = map[string]any{}
	}
	d.Patch[key] = v
	return d
}

// Level is a log level for Log.
type Level int32

// Log levels, as the ABI numbers them.
const (
	LevelDebug Level = 0
	LevelInfo  Level = 1
	LevelWarn  Level = 2
	LevelError Level = 3
)

// Handler decides.
type Handler func(Input) Decision

// state is the guest's only state: the handler and the buffers the host reads and writes.
// A guest instance runs one call at a time, so it needs no lock.
type state struct {
	handler Handler
	in      []byte // written by the host at the pointer alloc returned; new for every call
	out     []byte // the last result, kept alive until the next call
	cfg     []byte // scratch for Config
}

var guest state

// Handle sets the function that answers every decision. Call it from init.
func Handle(h Handler) { guest.handler = h }

// process decodes the input, runs the handler and encodes the result into guest.out.
func (s *state) process(raw []byte) []byte {
	in, err := decodeInput(raw)
	if err != nil {
		panic("sdk: invalid input: " + err.Error())
	}
	var d Decision
	if s.handler == nil {
		d = Deny("plugin has no handler: call sdk.Handle in init")
	} else {
		d = s.handler(in)
	}
	s.out = appendDecision(s.out[:0], d)
	return s.out
}

// alloc returns a new buffer of n bytes that the host fills with the input. It is never
// reused, so the decoded strings that point into it stay valid (one allocation per call instead
// of one per string: allocations are what a Go guest pays most for under the host's deadline).
func (s *state) alloc(n int) []byte {
	s.in = make([]byte, max(n, 1))
	return s.in[:n]
}
