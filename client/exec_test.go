package client

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// streamOf serves lines as an exec's NDJSON stream.
func streamOf(t *testing.T, lines string) *Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Accept") != "application/x-ndjson" {
			t.Errorf("Accept %q, want application/x-ndjson", r.Header.Get("Accept"))
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, lines)
	}))
	t.Cleanup(srv.Close)
	c, err := New(srv.URL, "key_test", WithHTTPClient(srv.Client()))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestExecStreamEnds: base64 chunks are decoded; an error line mid-stream is yielded as
// *Error (and ends the sequence); a stream cut before its end line is io.ErrUnexpectedEOF.
func TestExecStreamEnds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := streamOf(t, `{"stream":"stdout","data":"/w==","encoding":"base64"}`+"\n"+
		`{"error":{"type":"denied","code":"policy_violation","message":"killed by rule no_curl"}}`+"\n"+
		`{"stream":"stdout","data":"after the end"}`+"\n")
	var data []byte
	var last error
	n := 0
	for ev, err := range c.ExecStream(ctx, "sess_1", ExecRequest{Command: "x"}) {
		n++
		data, last = append(data, ev.Data...), err
	}
	var e *Error
	if string(data) != "\xff" || n != 2 || !errors.As(last, &e) || e.Code != "policy_violation" || e.Type != "denied" {
		t.Errorf("data %q, %d events, last error %v; want \\xff then the policy_violation *Error", data, n, last)
	}

	c = streamOf(t, `{"stream":"stdout","data":"partial"}`+"\n")
	if _, err := c.ExecCollect(ctx, "sess_1", ExecRequest{Command: "x"}); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("a stream without an end line: %v, want io.ErrUnexpectedEOF", err)
	}
}
