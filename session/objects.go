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
	NodeID   string `json:"-"`
}

// Run states.
const (
	RunQueued    = "queued"
	RunRunning   = "running"
	RunSucceeded = "succeeded"
	RunFailed    = "failed"
)

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
	Truncated   bool    `json:"truncated"`
	StdoutBytes int64   `json:"stdout_bytes"`
	StderrBytes int64   `json:"stderr_bytes"`
	Error       *string `json:"error"`
	StartedAt   *Time   `json:"started_at"`
	FinishedAt  *Time   `json:"finished_at"`
	DurationMs  *int64  `json:"duration_ms"`
	CreatedAt   Time    `json:"created_at"`
}
