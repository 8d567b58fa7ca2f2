package session

// GuestEventType names what happened in a running guest. New types may appear: deciders
// allow what they do not know.
type GuestEventType string

// The event types the nodes report to the runtime decision point.
const (
	GuestExec           GuestEventType = "exec"            // a command started through the API (or a PTY's, PTY set)
	GuestProcessStart   GuestEventType = "process_start"   // a process seen in the guest
	GuestEgress         GuestEventType = "egress"          // an outbound connection asked of the egress proxy
	GuestResourceSample GuestEventType = "resource_sample" // the guest's usage over the last interval
)

// GuestEvent is one event of a running guest, as a node reports it to the runtime decision
// point. Only the fields of its Type are read.
type GuestEvent struct {
	Type GuestEventType
	// exec, process_start
	Argv []string
	PTY  bool // exec: the command of a PTY
	PID  int  // process_start
	// egress
	Host      string
	Port      int
	Addresses []string // what Host resolved to, when known
	// resource_sample
	CPUMs       int64
	IntervalMs  int64
	MemoryBytes int64
}
