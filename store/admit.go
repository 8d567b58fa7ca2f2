package store

import (
	"context"
	"encoding/json"
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

// SpendCapError: a hard spend cap stops admissions in Scope ("project" or "end_user").
type SpendCapError struct{ Scope string }

func (e *SpendCapError) Error() string { return "the " + e.Scope + "'s monthly spend cap is reached" }

// Admit is a create's admission in one round trip: it takes a token from the project's rate
// bucket, checks the spend-cap flags, reserves one of a.Concurrency slots and writes sess in
// pending with its session.pending event, in one script. It answers a *RateLimitError, a
// *SpendCapError, a *ConcurrencyError or ErrExists at the first refusal, in that order (a
// token taken before a refusal stays taken). sess is as for Create.
func (s *Store) Admit(ctx context.Context, sess *session.Session, a Admission) (Admitted, error) {
	if err := session.Check("", sess.State, session.APIGateway, ""); err != nil {
		return Admitted{}, err
	}
	if sess.ID == "" || sess.ProjectID == "" {
		return Admitted{}, &session.FieldError{Field: "id", Message: "id and project_id are required"}
	}
	doc, err := json.Marshal(static{
		ID: sess.ID, Tier: sess.Tier, ProjectID: sess.ProjectID, EndUserID: sess.EndUserID,
		Template: sess.Template, Region: sess.Region, Resources: sess.Resources,
		VolumeID: sess.VolumeID, PolicyID: sess.PolicyID, RestoreFrom: sess.RestoreFrom,
		Connect: sess.Connect, Metadata: sess.Metadata,
	})
	if err != nil {
		return Admitted{}, fmt.Errorf("encode session: %w", err)
	}
	created := sess.CreatedAt.UnixMilli()
	hash := []any{"doc", doc, "state", string(session.Pending), "ver", 1,
		"idle_s", sess.IdleTimeoutS, "life_s", sess.MaxLifetimeS, "created", created}
	if desk := sess.Metadata[session.DesktopMetadataKey]; desk != "" {
		// For quota's settle script, which labels the session's usage with its desktop.
		hash = append(hash, "desk", desk)
	}
	args := a.args("write", sess.ID, sess.EndUserID, s.now, len(hash))
	args = append(args, hash...)
	args = append(args, eventFields(sess.ID, sess.ProjectID, "", session.Pending, session.APIGateway, "", "", created)...)
	res, err := admitScript.Run(ctx, s.rdb, admitKeys(sess.ProjectID, sess.ID, sess.EndUserID, a.CapMonth), args...).StringSlice()
	if err != nil {
		return Admitted{}, fmt.Errorf("create session %s: %w", sess.ID, err)
	}
	out, err := admitAnswer(res, a)
	if err != nil {
		return Admitted{}, err
	}
	s.afterCreate(ctx, sess)
	cp := *sess
	cp.Object = session.ObjectName
	cp.Version = 1
	out.Session = &cp
	return out, nil
}

// CheckAdmission is Admit's first part alone: it takes a token and checks the spend caps for
// project (and endUser, when not ""), and answers the slots the project holds, writing
// nothing else. For a create whose decision needs those slots, or has already failed (the
// rate limit and the caps answer first).
func (s *Store) CheckAdmission(ctx context.Context, project, endUser string, a Admission) (Admitted, error) {
	var eu *string
	if endUser != "" {
		eu = &endUser
	}
	res, err := admitScript.Run(ctx, s.rdb, admitKeys(project, "", eu, a.CapMonth), a.args("check", "", eu, s.now, 0)...).StringSlice()
	if err != nil {
		return Admitted{}, fmt.Errorf("admission of %s: %w", project, err)
	}
	return admitAnswer(res, a)
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

func admitKeys(project, id string, endUser *string, month string) []string {
	k := ProjectKeys(project)
	eu := ""
	if endUser != nil {
		eu = *endUser
	}
	return []string{
		k.RateBucket(), k.CapFlag("hard", month), k.CapFlag("soft", month),
		k.EndUserCapFlag(eu, "hard", month), k.EndUserCapFlag(eu, "soft", month),
		k.session(id), k.all(), k.byState(session.Pending), k.active(), k.Outbox(), k.byEndUser(eu),
	}
}

// args answers the script's arguments up to N (the hash's length).
func (a Admission) args(mode, id string, endUser *string, clock func() time.Time, n int) []any {
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
	return []any{max(a.RatePerSec, 0), max(a.Burst, 1), at.UnixMilli(), caps, mode, id, a.Concurrency, hasEU, n}
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
