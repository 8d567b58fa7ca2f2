package gateway

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

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

// idempotent makes a POST honour Idempotency-Key: the same key and body within 24 h answer
// the first result; the same key with another body answers 409. Errors a retry could fix
// (429, 5xx) are not remembered.
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
		sum := sha256.Sum256(append([]byte(r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery+"\n"), body...))
		fp := hex.EncodeToString(sum[:])
		rec, err := s.Store.IdemBegin(r.Context(), p.ID, key, fp)
		if err != nil {
			return err
		}
		if rec != nil {
			for k, v := range rec.Header {
				w.Header().Set(k, v)
			}
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(rec.Status)
			_, _ = w.Write(rec.Body)
			return nil
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		rw := &recorder{ResponseWriter: w, max: s.MaxReplayBytes}
		herr := h(rw, r, p)
		if herr != nil {
			s.writeError(rw, r, herr)
		}
		ctx := r.Context()
		if rw.status == 429 || rw.status >= 500 || rw.status == 0 {
			if err := s.Store.IdemRelease(ctx, p.ID, key); err != nil {
				s.log.Error("idempotency release", "err", err)
			}
			return nil
		}
		hdr := map[string]string{"Content-Type": rw.Header().Get("Content-Type")}
		if warn := rw.Header().Get("Warning"); warn != "" {
			hdr["Warning"] = warn
		}
		rec = &store.IdemRecord{Fingerprint: fp, Status: rw.status, Header: hdr, Body: rw.buf.Bytes()}
		if rw.over {
			// Too big to keep: a retry learns that, and the request is still not run twice.
			b, _ := json.Marshal(errorBody{Error: apiError{Type: "idempotency_error", Code: "replay_too_large",
				Message: fmt.Sprintf("the first answer to this Idempotency-Key was %d bytes, over the %d kept for replays (status %d); the request is not run again: read its result from the session or run it created", rw.written, s.MaxReplayBytes, rw.status)}})
			rec.Status, rec.Header, rec.Body = 409, map[string]string{"Content-Type": "application/json"}, append(b, '\n')
		}
		if err := s.Store.IdemFinish(ctx, p.ID, key, *rec); err != nil {
			s.log.Error("idempotency finish", "err", err)
		}
		return nil
	}
}
