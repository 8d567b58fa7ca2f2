package session

// Snapshot states.
const (
	SnapshotCreating = "creating"
	SnapshotReady    = "ready"
	SnapshotFailed   = "failed"
)

// Snapshot is a saved session (disk, and memory when IncludeMemory).
type Snapshot struct {
	ID            string `json:"id"`
	Object        string `json:"object"` // "snapshot"
	SessionID     string `json:"session_id"`
	IncludeMemory bool   `json:"include_memory"`
	State         string `json:"state"`
	SizeBytes     int64  `json:"size_bytes"`
	CreatedAt     Time   `json:"created_at"`
	// Template and Tier of the session it was taken from; a restore uses them.
	Template string `json:"template"`
	Tier     int    `json:"tier"`
	// FailureReason says why a failed snapshot failed, as its request was answered (or that
	// the gateway taking it stopped before it was done), for a caller that reads it later.
	FailureReason string `json:"failure_reason,omitempty"`
	NodeID        string `json:"-"`
}

// SnapshotRecord is a Snapshot as the control plane keeps it, with what its restore needs that
// the API does not show (a reader of the Snapshot alone ignores it).
type SnapshotRecord struct {
	Snapshot
	// RootImage names the root disk image a memory snapshot's guest ran on, where its memory
	// can be restored only on a node that has it (store.NodeInfo.Images); "" where any can.
	RootImage string `json:"root_image,omitempty"`
}

// Run states.
const (
	RunQueued    = "queued"
	RunRunning   = "running"
	RunSucceeded = "succeeded"
	RunFailed    = "failed"
)

// RunOrphaned is the error of a run whose gateway stopped before it recorded the run's end
// (a recovery, or the move of a run saved before runs had keys of their own, records it).
const RunOrphaned = "the gateway running it stopped before it finished; run it again"

// Run is one command run in a session, or an ephemeral tier-1 run.
type Run struct {
	ID        string  `json:"id"`
	Object    string  `json:"object"` // "run"
	SessionID *string `json:"session_id"`
	State     string  `json:"state"`
	ExitCode  *int    `json:"exit_code"`
	Stdout    string  `json:"stdout"`
	Stderr    string  `json:"stderr"`
	// As in ExecResult: the output kept is capped per stream; the counts are of all of it.
	Truncated   bool  `json:"truncated"`
	StdoutBytes int64 `json:"stdout_bytes"`
	StderrBytes int64 `json:"stderr_bytes"`
	// OutputExpired: the output was dropped before the run's retention ran out, to keep the
	// project's stored output within its budget (Stdout and Stderr are empty; the counts stay).
	OutputExpired bool    `json:"output_expired"`
	Error         *string `json:"error"`
	StartedAt     *Time   `json:"started_at"`
	FinishedAt    *Time   `json:"finished_at"`
	DurationMs    *int64  `json:"duration_ms"`
	CreatedAt     Time    `json:"created_at"`
}

// List is the envelope of every list the API answers: {"object": "list", "data": [...],
// "next_cursor": "..." or null}.
type List[T any] struct {
	Object     string  `json:"object"` // "list"
	Data       []T     `json:"data"`
	NextCursor *string `json:"next_cursor"`
}

// NewList returns the page data with next as its cursor ("" for the last page: null). A nil
// data is an empty list, never null.
func NewList[T any](data []T, next string) List[T] {
	if data == nil {
		data = []T{}
	}
	l := List[T]{Object: "list", Data: data}
	if next != "" {
		l.NextCursor = &next
	}
	return l
}

// DeletedObject answers the delete of an object that has an id (a snapshot, a webhook
// endpoint).
type DeletedObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"` // the deleted object's kind
	Deleted bool   `json:"deleted"`
}

// ExecEnd is the last line of a streamed exec that ran to its end.
type ExecEnd struct {
	ExitCode   int   `json:"exit_code"`
	DurationMs int64 `json:"duration_ms"`
	TimedOut   bool  `json:"timed_out"`
}
