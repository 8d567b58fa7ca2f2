package store

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/session"
)

// Admission is what a create must pass besides the request itself: the project's rate limit,
// its spend caps in force this month and its concurrency limit.
type Admission struct {
	// RatePerSec and Burst are the project's token bucket of creates; RatePerSec 0 takes no
	// token (a Create of the store's own).
	RatePerSec, Burst int
	// CapMonth (YYYYMM), when set, checks the hard and soft spend-cap flags of that month, the
	// project's and, with the session's end user, that user's.
	CapMonth string
	// Concurrency is the number of slots the project may hold.
	Concurrency int
	// At is when the create happens, for the token bucket (zero: the store's clock).
	At time.Time
}

// Admitted is an admitted create.
type Admitted struct {
	Session *session.Session
	// SoftCapped: a soft spend cap in scope was passed this month (a warning, not a refusal).
	SoftCapped bool
	// Active is the slots the project held before this one.
	Active int64
}

// RateLimitError: the project's token bucket is empty; a token is there after Wait.
type RateLimitError struct{ Wait time.Duration }

func (e *RateLimitError) Error() string { return fmt.Sprintf("rate limited; retry after %s", e.Wait) }

// SpendCapError: a spend cap stops admissions in Scope ("project" or "end_user"): the hard
// cap, or the soft one whose spend decision denied them.
type SpendCapError struct{ Scope string }

func (e *SpendCapError) Error() string { return "the " + e.Scope + "'s monthly spend cap is reached" }

// Admit is a create's admission in one round trip (which concurrent creates may share:
// sharedTrips): it takes a token from the project's rate
// bucket, checks the spend-cap flags, reserves one of a.Concurrency slots and writes sess in
// pending with its session.pending event, in one script. It answers ErrExists, a
// *RateLimitError, a *SpendCapError or a *ConcurrencyError at the first refusal, in that
// order (a token taken before a refusal stays taken; a session that exists takes none, so
// that the write sent again after its answer was lost finds its own session, whatever the
// bucket holds). sess is as for Create.
func (s *Store) Admit(ctx context.Context, sess *session.Session, a Admission) (Admitted, error) {
	if err := session.Check("", sess.State, session.APIGateway, ""); err != nil {
		return Admitted{}, err
	}
	if sess.ID == "" || sess.ProjectID == "" {
		return Admitted{}, &session.FieldError{Field: "id", Message: "id and project_id are required"}
	}
	keys, args, inScript := s.admitCall(sess, a)
	res, err := s.admits.run(ctx, keys, args...)
	if err != nil {
		return Admitted{}, fmt.Errorf("create session %s: %w", sess.ID, err)
	}
	out, err := admitAnswer(res, a)
	if err != nil {
		return Admitted{}, err
	}
	if !inScript {
		s.afterCreate(ctx, sess)
	}
	cp := *sess
	cp.Object = session.ObjectName
	cp.Version = 1
	out.Session = &cp
	return out, nil
}

// admitCall answers the admit script's keys and arguments for sess, and whether the script
// signals the create (createWrites.inScript). Each slice is made once at its final size: the
// pieces appended in turn, each in a slice of its own, were a tenth of a create's allocations.
func (s *Store) admitCall(sess *session.Session, a Admission) (keys []string, args []any, inScript bool) {
	sig := s.createSignals(sess)
	keys = appendAdmitKeys(make([]string, 0, admitKeyCount+len(sig.keys)), sess.ProjectID, sess.ID, sess.EndUserID, a.CapMonth)
	keys = append(keys, sig.keys...)
	args = make([]any, 0, admitArgCount+len(sig.args)+1+maxWrittenArgs)
	args = append(a.appendArgs(args, sess.ID, sess.EndUserID, s.now), sig.args...)
	return keys, s.appendSessionFields(args, sess), sig.inScript()
}

// maxWrittenArgs bounds what appendSessionFields appends: n, the hash's fields (up to 7 pairs)
// and the event's (11 pairs).
const maxWrittenArgs = 1 + 2*7 + 2*eventFieldCount

// appendSessionFields appends a pending session as the admission scripts write it: n, the
// number of values of its hash's fields (field and value each) that follow, then its
// session.pending event's.
func (s *Store) appendSessionFields(args []any, sess *session.Session) []any {
	d := static{
		ID: sess.ID, Tier: sess.Tier, ProjectID: sess.ProjectID, EndUserID: sess.EndUserID,
		Template: sess.Template, Region: sess.Region, Resources: sess.Resources,
		VolumeID: sess.VolumeID, PolicyID: sess.PolicyID, RestoreFrom: sess.RestoreFrom,
		Connect: sess.Connect, Metadata: sess.Metadata,
	}
	doc := d.appendJSON(make([]byte, 0, 512))
	created := sess.CreatedAt.UnixMilli()
	at := len(args)
	args = append(args, 0, "doc", doc, "state", string(session.Pending), "ver", 1,
		"idle_s", sess.IdleTimeoutS, "life_s", sess.MaxLifetimeS, "created", created)
	if desk := sess.Metadata[session.DesktopMetadataKey]; desk != "" {
		// For quota's settle script, which labels the session's usage with its desktop.
		args = append(args, "desk", desk)
	}
	args[at] = len(args) - at - 1
	return appendEventFields(args, sess.ID, sess.ProjectID, "", session.Pending, session.APIGateway, "", "", created)
}

// ReservationLapse is how long a slot held by Reserve stays held without a Commit or a
// Release: after it, the next Reserve of the project gives it back (the create's gateway is
// taken to have died in between) and a late Commit fails. Far above any decision's deadline.
const ReservationLapse = time.Minute

// Reservation is a create's admission before its decision (Reserve): the token is taken, the
// caps are checked and, unless Err answers why not, a slot is held under the session's id.
type Reservation struct {
	Project, ID string
	// SoftCapped: a soft spend cap in scope was passed this month.
	SoftCapped bool
	// Active is the slots the project held before this create's: the count its decision sees.
	Active int64
	limit  int
	status string // HELD, EXISTS or FULL
	token  string // this request's, as the slot's holder
}

// Held reports whether r holds a slot, which Commit or Release must then end.
func (r Reservation) Held() bool { return r.status == "HELD" }

// Unsure reports whether r may hold a slot that nobody knows of: Reserve failed after its
// script may have run (its answer lost on the way back, as when Redis fails over). Release
// gives such a slot back, and does nothing when the script held none.
func (r Reservation) Unsure() bool { return r.status == statusUnsure }

// statusUnsure is the status of a Reservation whose script's answer never came.
const statusUnsure = "UNSURE"

// Err answers why the create cannot be written, nil when r holds a slot: ErrExists (a session
// has the id) or a *ConcurrencyError. These refuse only after the decision, whose refusals
// answer first, as when the slot was taken after it.
func (r Reservation) Err() error {
	switch r.status {
	case "HELD":
		return nil
	case "EXISTS":
		return ErrExists
	}
	return &ConcurrencyError{Limit: r.limit, Used: int(r.Active)}
}

// Reserve is the first part of a create's admission whose decision needs the slots in use,
// in one round trip: it takes a token from the project's rate bucket and checks the
// spend-cap flags, answering a *RateLimitError or a *SpendCapError at the first refusal (no
// decision sees those creates), then holds one of a.Concurrency slots under id, for
// ReservationLapse, and answers the slots held before it. When id is taken or no slot is
// free it holds none and says so in Err. A held slot ends with Commit or Release. When Reserve
// fails after its script may have run, the Reservation it answers with the error is Unsure.
func (s *Store) Reserve(ctx context.Context, project, id, endUser string, a Admission) (Reservation, error) {
	if id == "" || project == "" {
		return Reservation{}, &session.FieldError{Field: "id", Message: "id and project_id are required"}
	}
	at := a.At
	if at.IsZero() {
		at = s.now()
	}
	caps := "0"
	if a.CapMonth != "" {
		caps = "1"
	}
	token := session.NewID("rsv_", at)
	res, err := reserveScript.Run(ctx, s.rdb, reserveKeys(project, id, endUser, a.CapMonth),
		"reserve", id, hasEndUser(endUser), max(a.RatePerSec, 0), max(a.Burst, 1), at.UnixMilli(), caps,
		a.Concurrency, ReservationLapse.Milliseconds(), token).StringSlice()
	if err != nil {
		// Whatever the error, an attempt may have run: go-redis retries a command that failed
		// on its connection and answers the last attempt's error (a refused dial, say).
		return Reservation{Project: project, ID: id, status: statusUnsure, token: token}, fmt.Errorf("admission of %s: %w", id, err)
	}
	switch res[0] {
	case "HELD", "EXISTS", "FULL":
		if len(res) < 3 {
			break
		}
		active, err := strconv.ParseInt(res[2], 10, 64)
		if err != nil {
			return Reservation{}, fmt.Errorf("admission of %s: slots in use %q: %w", id, res[2], err)
		}
		return Reservation{Project: project, ID: id, SoftCapped: res[1] == "1", Active: active, limit: a.Concurrency, status: res[0],
			token: token}, nil
	}
	_, err = admitAnswer(res, a)
	if err == nil {
		err = fmt.Errorf("reserve script answered %q", res)
	}
	return Reservation{}, err
}

// Commit writes sess in pending with its session.pending event in the slot r holds, and
// signals its work, as Admit does: in one round trip on one Redis, in two on a Cluster. It
// answers ErrExists when a session has the id, and ErrLapsed when r lapsed. sess is as for
// Create, with r's project and id.
func (s *Store) Commit(ctx context.Context, r Reservation, sess *session.Session) (Admitted, error) {
	if !r.Held() || sess.ProjectID != r.Project || sess.ID != r.ID {
		return Admitted{}, fmt.Errorf("commit %s: the reservation is of %s/%s and holds %s", sess.ID, r.Project, r.ID, r.status)
	}
	if err := session.Check("", sess.State, session.APIGateway, ""); err != nil {
		return Admitted{}, err
	}
	eu := ""
	if sess.EndUserID != nil {
		eu = *sess.EndUserID
	}
	sig := s.createSignals(sess)
	args := append([]any{"commit", r.ID, hasEndUser(eu)}, sig.args...)
	args = s.appendSessionFields(args, sess)
	keys := append(reserveKeys(r.Project, r.ID, eu, ""), sig.keys...)
	res, err := reserveScript.Run(ctx, s.rdb, keys, args...).StringSlice()
	if err != nil {
		return Admitted{}, fmt.Errorf("create session %s: %w", sess.ID, err)
	}
	switch res[0] {
	case "OK":
		if !sig.inScript() {
			s.afterCreate(ctx, sess)
		}
	case "EXISTS":
		return Admitted{}, ErrExists
	default:
		return Admitted{}, fmt.Errorf("create session %s: %w (over %s after it was reserved)", sess.ID, ErrLapsed, ReservationLapse)
	}
	cp := *sess
	cp.Object = session.ObjectName
	cp.Version = 1
	return Admitted{Session: &cp, SoftCapped: r.SoftCapped, Active: r.Active}, nil
}

// Release gives back the slot r holds (or, Unsure, may hold), for a create refused after
// Reserve: nothing of it stays (no slot, no session, no event). A session written under r's
// id keeps its slot (a Commit whose answer was lost), and so does a later Reserve of the id
// that shares it (a retry with the same Idempotency-Key): Release is safe to repeat, late.
func (s *Store) Release(ctx context.Context, r Reservation) error {
	if !r.Held() && !r.Unsure() {
		return nil
	}
	if err := reserveScript.Run(ctx, s.rdb, reserveKeys(r.Project, r.ID, "", ""), "release", r.ID, "0", r.token).Err(); err != nil {
		return fmt.Errorf("release the slot of %s: %w", r.ID, err)
	}
	return nil
}

func hasEndUser(endUser string) string {
	if endUser != "" {
		return "1"
	}
	return "0"
}

func reserveKeys(project, id, endUser, month string) []string {
	k := ProjectKeys(project)
	return []string{
		k.RateBucket(), k.CapFlag("hard", month), k.CapFlag("soft", month),
		k.EndUserCapFlag(endUser, "hard", month), k.EndUserCapFlag(endUser, "soft", month),
		k.session(id), k.all(), k.byState(session.Pending), k.active(), k.Outbox(), k.byEndUser(endUser),
		k.reservations(), k.reservationHolders(), k.Webhooks().Endpoints(),
	}
}

// TakeToken takes one token from project's bucket of rate tokens a second (up to burst). When
// the bucket is empty it answers false and how long until a token is there.
func TakeToken(ctx context.Context, rdb redis.Scripter, project string, rate, burst int, now time.Time) (bool, time.Duration, error) {
	res, err := tokenBucketScript.Run(ctx, rdb, []string{ProjectKeys(project).RateBucket()}, rate, max(burst, 1), now.UnixMilli()).Int64Slice()
	if err != nil {
		return false, 0, fmt.Errorf("rate limit %s: %w", project, err)
	}
	return res[0] == 1, time.Duration(res[1]) * time.Millisecond, nil
}

// admitKeyCount is how many keys appendAdmitKeys appends.
const admitKeyCount = 12

func appendAdmitKeys(keys []string, project, id string, endUser *string, month string) []string {
	k := ProjectKeys(project)
	eu := ""
	if endUser != nil {
		eu = *endUser
	}
	return append(keys,
		k.RateBucket(), k.CapFlag("hard", month), k.CapFlag("soft", month),
		k.EndUserCapFlag(eu, "hard", month), k.EndUserCapFlag(eu, "soft", month),
		k.session(id), k.all(), k.byState(session.Pending), k.active(), k.Outbox(), k.byEndUser(eu),
		k.Webhooks().Endpoints(),
	)
}

// admitArgCount is how many arguments appendArgs appends.
const admitArgCount = 7

// appendArgs appends the script's arguments up to signal_created's.
func (a Admission) appendArgs(args []any, id string, endUser *string, clock func() time.Time) []any {
	at := a.At
	if at.IsZero() {
		at = clock()
	}
	caps, hasEU := "0", "0"
	if a.CapMonth != "" {
		caps = "1"
	}
	if endUser != nil {
		hasEU = "1"
	}
	return append(args, max(a.RatePerSec, 0), max(a.Burst, 1), at.UnixMilli(), caps, id, a.Concurrency, hasEU)
}

func admitAnswer(res []string, a Admission) (Admitted, error) {
	num := func(i int) int64 {
		if i >= len(res) {
			return 0
		}
		v, _ := strconv.ParseInt(res[i], 10, 64)
		return v
	}
	switch res[0] {
	case "RATE":
		return Admitted{}, &RateLimitError{Wait: time.Duration(num(1)) * time.Millisecond}
	case "CAPPED":
		return Admitted{}, &SpendCapError{Scope: res[1]}
	case "EXISTS":
		return Admitted{}, ErrExists
	case "LIMIT":
		return Admitted{}, &ConcurrencyError{Limit: a.Concurrency, Used: int(num(1))}
	case "OK":
		return Admitted{SoftCapped: num(1) == 1, Active: num(2)}, nil
	}
	return Admitted{}, fmt.Errorf("admission script answered %q", res[0])
}
