package desktop

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode"

	"wb/session"
)

// IDPrefix starts every desktop id (API.md, "Ids").
const IDPrefix = "desk_"

// ObjectName is the object field of a Desktop.
const ObjectName = "desktop"

// MaxNameLen bounds a desktop's name.
const MaxNameLen = 100

// MaxPerProject bounds a project's desktops, in any state: each create starts a session and a
// lease on it in the background, and a failed or stopped one keeps its record and snapshots
// until it is deleted.
const MaxPerProject = 100

// Desktop is the API object (API.md, "Desktops").
type Desktop struct {
	ID        string `json:"id"`
	Object    string `json:"object"`
	ProjectID string `json:"project_id"`
	Name      string `json:"name"`
	Size      Size   `json:"size"`
	// NextSize is a resize waiting for the next start of an awake desktop.
	NextSize Size  `json:"next_size,omitempty"`
	State    State `json:"state"`
	// Message says why the desktop failed, or why a sleep could not save its state.
	Message string `json:"message,omitempty"`
	// StateSaved is true for an asleep desktop whose screen and processes were saved; the
	// seed's "asleep: state not saved" leaves it out.
	StateSaved bool   `json:"state_saved,omitempty"`
	MCPURL     string `json:"mcp_url"`
	// SessionID is the session the desktop runs as while awake.
	SessionID  string        `json:"session_id,omitempty"`
	LastUsedAt *session.Time `json:"last_used_at,omitempty"`
	CreatedAt  session.Time  `json:"created_at"`
	UpdatedAt  session.Time  `json:"updated_at"`
}

// Record is a desktop as the store keeps it: the object, and what lies behind it.
type Record struct {
	Desktop
	// DiskSnapshot is the desktop's disk: the latest disk-only snapshot ("" before the first
	// stop or sleep: the disk is then the template's).
	DiskSnapshot string `json:"disk_snapshot,omitempty"`
	// MemorySnapshot is the sleeping desktop's saved state ("" when none).
	MemorySnapshot string `json:"memory_snapshot,omitempty"`
	// Goal is where a desktop in stopping is going (asleep or stopped).
	Goal State `json:"goal,omitempty"`
	// SavingDisk and SavingState name the snapshots a halt under way takes (the disk's, and
	// for a sleep the saved state's), written before it takes them: a halt resumed by a
	// recovery (its gateway died, or Redis failed the record of its end) finds them by name,
	// where they would otherwise stay listed, billed, with the desktop ending without them.
	SavingDisk  string `json:"saving_disk,omitempty"`
	SavingState string `json:"saving_state,omitempty"`
	// From is where a desktop in starting came from (asleep, stopped or failed; "" for a
	// create): where it goes back to, as it was, when admission refuses its session for the
	// project's spend cap or limits.
	From State `json:"from,omitempty"`
	// Version counts the record's writes; the store compares it (not stored in the JSON).
	Version int64 `json:"-"`
}

// Public answers the API object.
func (r Record) Public() Desktop {
	d := r.Desktop
	d.Object = ObjectName
	if d.State != Asleep {
		d.StateSaved = false
	}
	if !d.State.Awake() && d.State != Stopping {
		d.SessionID = ""
	}
	return d
}

// CreateRequest is the body of POST /v1/desktops.
type CreateRequest struct {
	Name string `json:"name"`
	Size string `json:"size,omitempty"`
}

// Validate checks the request and answers the size (DefaultSize when absent).
func (r CreateRequest) Validate() (Size, error) {
	if err := ValidateName(r.Name); err != nil {
		return "", err
	}
	if r.Size == "" {
		return DefaultSize, nil
	}
	return ParseSize("size", r.Size)
}

// ValidateName checks a desktop's name: 1–100 characters, none of them control characters.
func ValidateName(name string) error {
	if strings.TrimSpace(name) == "" {
		return &session.FieldError{Field: "name", Message: "is required: a name for the desktop (1–100 characters)"}
	}
	if n := len([]rune(name)); n > MaxNameLen {
		return &session.FieldError{Field: "name", Message: fmt.Sprintf("at most %d characters, got %d", MaxNameLen, n)}
	}
	if strings.IndexFunc(name, unicode.IsControl) >= 0 {
		return &session.FieldError{Field: "name", Message: "must not contain control characters"}
	}
	return nil
}

// PatchRequest is the body of PATCH /v1/desktops/{id}.
type PatchRequest struct {
	Size *string `json:"size,omitempty"`
}

// Resize answers r with its size changed to size (seed 001, "Changing the size"): an asleep
// or stopped desktop has it at once, and a sleeping one's saved state no longer fits it, so
// dropped answers the memory snapshot to discard; an awake one has it from its next start
// (NextSize), which is a fresh one. Asking for the size it has clears a waiting resize.
func Resize(r Record, size Size) (out Record, dropped string) {
	out = r
	switch r.State {
	case Asleep, Stopped, Failed:
		if size != r.Size && r.MemorySnapshot != "" {
			dropped = r.MemorySnapshot
			out.MemorySnapshot, out.StateSaved = "", false
		}
		out.Size, out.NextSize = size, ""
	default: // starting, running, stopping: the session keeps its size
		out.NextSize = size
		if size == r.Size {
			out.NextSize = ""
		}
	}
	return out, dropped
}

// StartSize answers the size the desktop's next session has, and whether that start must
// be fresh from the disk (a waiting resize: the saved state belongs to the old size).
func (r Record) StartSize() (Size, bool) {
	if r.NextSize != "" && r.NextSize != r.Size {
		return r.NextSize, true
	}
	return r.Size, false
}

// Touched answers r used at t.
func (r Record) Touched(t time.Time) Record {
	r.LastUsedAt = session.At(t)
	return r
}

// Events are the webhook event types of desktops: one per state a transition enters, and
// desktop.deleted.
func Events() []string {
	out := make([]string, 0, len(States())+1)
	for _, s := range States() {
		out = append(out, EventType(s))
	}
	return append(out, EventDeleted)
}

// EventDeleted is the event of a deleted desktop.
const EventDeleted = "desktop.deleted"

// EventType is the event of a transition into s.
func EventType(s State) string { return "desktop." + string(s) }

// Execer runs one command in a desktop's running guest and answers its result (a session
// exec). It has the method set of wb/desktop/guest's Execer, whose Start the gateway calls
// after each fresh (not restored) start.
type Execer interface {
	Exec(ctx context.Context, argv []string, stdin []byte) (stdout, stderr []byte, exitCode int, err error)
}
