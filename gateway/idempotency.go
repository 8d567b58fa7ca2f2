package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"wb/store"
)

// MaxIdempotencyKeyLen bounds the Idempotency-Key header.
const MaxIdempotencyKeyLen = 255

// recorder keeps a copy of what a handler writes, up to max bytes; past it the copy is
// dropped (over), so that a long stream never piles up in memory.
type recorder struct {
	http.ResponseWriter
	status  int
	buf     bytes.Buffer
	max     int
	over    bool
	written int64
	cut     bool // the answer was cut off before its end (cutOff)
}

// cutOff marks the answer as cut off before its end by the handler (an exec whose caller
// stopped reading): what was written is no whole answer to replay.
func (r *recorder) cutOff() { r.cut = true }

// markCutOff tells the recorder under w, if there is one, that the answer was cut off.
func markCutOff(w http.ResponseWriter) {
	for w != nil {
		if r, ok := w.(*recorder); ok {
			r.cutOff()
			return
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return
		}
		w = u.Unwrap()
	}
}

// Flush passes flushes on, so that a streamed answer still streams.
func (r *recorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (r *recorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = 200
	}
	r.written += int64(len(b))
	if !r.over && r.buf.Len()+len(b) > r.max {
		r.over = true
		r.buf = bytes.Buffer{}
	}
	if !r.over {
		r.buf.Write(b)
	}
	return r.ResponseWriter.Write(b)
}

// idemRefKey is the request context's key for the Idempotency-Key claim's ref.
type idemRefKey struct{}

// idemRef is what a handler learns of the Idempotency-Key its request holds.
type idemRef struct {
	// ref names what the request creates: "sess_", "run_" (and its ephemeral session
	// "sess_"), "desk_", "whe_" or "snap_" + ref. It is random (no id shows the key) and the
	// same for every request that holds the key in turn, so a retry that takes over from a
	// gateway that died mid-request finds what that one created instead of creating it again.
	ref string
	// resumed: an earlier request with this key ended without an answer.
	resumed bool
}

// idemRefOf answers the request's claim on its Idempotency-Key (zero: it sent none).
func idemRefOf(ctx context.Context) idemRef {
	r, _ := ctx.Value(idemRefKey{}).(idemRef)
	return r
}

// fingerprint is what makes two requests with one Idempotency-Key the same request.
func fingerprint(r *http.Request, body []byte) string {
	sum := sha256.Sum256(append([]byte(r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery+"\n"), body...))
	return hex.EncodeToString(sum[:])
}

// idempotent makes a POST honour Idempotency-Key: the same key and body within 24 h answer
// the first result; the same key with another body answers 409, as does the same key while
// another request with it runs. A request holds the key with a lease its gateway renews: a
// gateway killed mid-request leaves the key to the first retry after the lease (10 s), which
// creates under the same ref (idemRef) and so finds what the dead one created. Errors a
// retry could fix (429, 5xx) are not remembered.
func (s *Server) idempotent(h handler) handler {
	return func(w http.ResponseWriter, r *http.Request, p store.Project) error {
		key := r.Header.Get("Idempotency-Key")
		if key == "" {
			return h(w, r, p)
		}
		if len(key) > MaxIdempotencyKeyLen {
			return errInvalid("Idempotency-Key", "Idempotency-Key is at most %d characters", MaxIdempotencyKeyLen)
		}
		body, err := readBody(r)
		if err != nil {
			return err
		}
		fp := fingerprint(r, body)
		rec, claim, err := s.Store.IdemBegin(r.Context(), p.ID, key, fp)
		if err != nil {
			return err
		}
		if rec != nil {
			// A replay may be megabytes (an exec's or a run's answer, up to MaxReplayBytes):
			// its writes to a caller that takes none of it are bounded, as the first's were.
			return s.stallBounded(func(w http.ResponseWriter, _ *http.Request, _ store.Project) error {
				for k, v := range rec.Header {
					w.Header().Set(k, v)
				}
				w.Header().Set("Idempotent-Replayed", "true")
				w.WriteHeader(rec.Status)
				_, _ = w.Write(rec.Body)
				return nil
			})(w, r, p)
		}
		// The answer is recorded even when the caller has gone: a retry wants it.
		ctx := context.WithoutCancel(r.Context())
		stop := s.renewIdem(ctx, p.ID, key, claim)
		r = r.WithContext(context.WithValue(r.Context(), idemRefKey{}, idemRef{ref: claim.Ref, resumed: claim.Resumed}))
		r.Body = io.NopCloser(bytes.NewReader(body))
		rw := &recorder{ResponseWriter: w, max: s.MaxReplayBytes}
		herr := h(rw, r, p)
		if herr != nil {
			s.writeError(rw, r, herr)
		}
		stop()
		var ae *apiError
		undecided := errors.As(herr, &ae) && ae.Code == "policy_error"
		if rw.status == 429 || undecided || rw.status >= 500 || rw.status == 0 {
			// A 429, or a command the session's policy could not decide on, is a refusal
			// before anything is written: the key is forgotten, unless this request took it
			// over from one that may still write under its ref (a gateway that died, or was
			// thought to). After a 5xx (or no answer) something may have been: a retry with
			// this body takes the key over with its ref.
			forget := (rw.status == 429 || undecided) && !claim.Resumed
			if err := s.Store.IdemRelease(ctx, p.ID, key, claim, forget); err != nil {
				s.log.Error("idempotency release", "err", err)
			}
			return nil
		}
		hdr := map[string]string{"Content-Type": rw.Header().Get("Content-Type")}
		if warn := rw.Header().Get("Warning"); warn != "" {
			hdr["Warning"] = warn
		}
		rec = &store.IdemRecord{Fingerprint: fp, Status: rw.status, Header: hdr, Body: rw.buf.Bytes()}
		if rw.cut {
			// Cut off (the caller stopped reading, and the stall ended the exec): its bytes
			// end mid-answer, without a result or an error; a retry learns that instead, and
			// the request is still not run twice.
			b, _ := json.Marshal(errorBody{Error: apiError{Type: "idempotency_error", Code: "replay_incomplete",
				Message: fmt.Sprintf("the first answer to this Idempotency-Key (status %d) was cut off after %d bytes: its caller stopped reading it, and the request was ended; it is not run again: read its effects from the session", rw.status, rw.written)}})
			rec.Status, rec.Header, rec.Body = 409, map[string]string{"Content-Type": "application/json"}, append(b, '\n')
		} else if rw.over {
			// Too big to keep: a retry learns that, and the request is still not run twice.
			b, _ := json.Marshal(errorBody{Error: apiError{Type: "idempotency_error", Code: "replay_too_large",
				Message: fmt.Sprintf("the first answer to this Idempotency-Key was %d bytes, over the %d kept for replays (status %d); the request is not run again: read its result from the session or run it created", rw.written, s.MaxReplayBytes, rw.status)}})
			rec.Status, rec.Header, rec.Body = 409, map[string]string{"Content-Type": "application/json"}, append(b, '\n')
		}
		// Should the project's budget of stored output drop this answer, a replay says so.
		b, _ := json.Marshal(errorBody{Error: apiError{Type: "idempotency_error", Code: "replay_too_large",
			Message: fmt.Sprintf("the first answer to this Idempotency-Key (status %d, %d bytes) is no longer kept: the project's stored output (runs' and answers kept for replays) passed its budget of %d bytes, and the oldest went first; the request is not run again: read its result from the session or run it created", rw.status, rw.written, s.outputBudget())}})
		dropped := &store.IdemRecord{Status: 409, Header: map[string]string{"Content-Type": "application/json"}, Body: append(b, '\n')}
		if err := s.Store.IdemFinish(ctx, p.ID, key, claim, *rec, dropped, s.outputBudget()); err != nil {
			s.log.Error("idempotency finish", "err", err)
		}
		return nil
	}
}

// renewIdem renews claim's lease every third of it until the answered stop, so that no retry
// takes over from a request that is alive, however long it runs.
func (s *Server) renewIdem(ctx context.Context, project, key string, claim *store.IdemClaim) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(s.Store.IdemLease() / 3)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if ok, err := s.Store.IdemRenew(ctx, project, key, claim); err != nil || !ok {
					s.log.Warn("idempotency lease", "held", ok, "err", err)
				}
			}
		}
	}()
	return func() { close(done); <-finished }
}
