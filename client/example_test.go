package client_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"wb/client"
)

// Create a session, wait for it, stream a command's output, and delete the session.
func Example() {
	baseURL, apiKey, stop := exampleServer() // in real use: os.Getenv("WB_URL"), os.Getenv("WB_API_KEY")
	defer stop()
	ctx := context.Background()

	c, err := client.New(baseURL, apiKey)
	if err != nil {
		log.Fatal(err)
	}
	s, err := c.CreateSession(ctx, client.CreateSessionRequest{Tier: 2})
	if err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSession(ctx, s.ID)
	if s, err = c.WaitSession(ctx, s.ID, "running"); err != nil {
		log.Fatal(err)
	}
	for ev, err := range c.ExecStream(ctx, s.ID, client.ExecRequest{Command: "echo hello; echo oops >&2; exit 3"}) {
		if err != nil {
			log.Fatal(err)
		}
		if ev.End != nil {
			fmt.Println("exit code", ev.End.ExitCode)
			break
		}
		fmt.Printf("%s: %s", ev.Stream, ev.Data)
	}
	// Output:
	// stdout: hello
	// stderr: oops
	// exit code 3
}

// exampleServer stands in for a wb deployment: just enough of the API for Example.
func exampleServer() (url, apiKey string, stop func()) {
	mux := http.NewServeMux()
	session := func(state string) string {
		return `{"id":"sess_ex","object":"session","tier":2,"state":"` + state + `","created_at":"2026-01-01T00:00:00.000Z"}`
	}
	mux.HandleFunc("POST /v1/sessions", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
		io.WriteString(w, session("pending"))
	})
	mux.HandleFunc("GET /v1/sessions/{id}", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, session("running")) })
	mux.HandleFunc("DELETE /v1/sessions/{id}", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(202)
		io.WriteString(w, session("stopping"))
	})
	mux.HandleFunc("POST /v1/sessions/{id}/exec", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, strings.Join([]string{`{"stream":"stdout","data":"hello\n"}`, `{"stream":"stderr","data":"oops\n"}`,
			`{"exit_code":3,"duration_ms":4,"timed_out":false}`}, "\n")+"\n")
	})
	srv := httptest.NewServer(mux)
	return srv.URL, "wb_example_key", srv.Close
}

// Verify a webhook delivery in an endpoint's handler with the secret CreateWebhookEndpoint
// answered.
func ExampleVerifyWebhook() {
	secret := "whsec_c2VjcmV0LWtleS1vZi10aGUtZW5kcG9pbnQ=" // from CreateWebhookEndpoint, kept by the caller
	http.HandleFunc("POST /webhooks/wb", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "read", http.StatusBadRequest)
			return
		}
		ev, err := client.VerifyWebhook(secret, r.Header, body)
		if err != nil {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		fmt.Fprintf(w, "got %s", ev.Type) // deduplicate on ev.ID: delivery is at least once
	})
}
