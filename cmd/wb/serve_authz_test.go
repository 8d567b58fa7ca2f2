package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"wb/internal/syncbuf"
	"wb/internal/testwait"
)

// TestServeAuthz: `wb serve --authz-addr` serves ext_authz over gRPC for the API it serves:
// a session created through the API is known to it by key and by its connect token (409:
// with no node it stays pending), an unknown one answers 404 and a bad key 401.
func TestServeAuthz(t *testing.T) {
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("busybox-static is needed to assemble the templates")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	var logs syncbuf.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--addr", "127.0.0.1:0", "--authz-addr", "127.0.0.1:0", "--runtime", "none",
			"--data-dir", t.TempDir(), "--log-level", "info"}, pw, &logs)
		pw.Close()
	}()
	env := map[string]string{}
	lines := make(chan struct{})
	go func() {
		b := make([]byte, 4096)
		var got string
		for strings.Count(got, "\n") < 3 {
			n, err := pr.Read(b)
			if err != nil {
				break
			}
			got += string(b[:n])
		}
		for _, l := range strings.Split(strings.TrimSpace(got), "\n") {
			k, v, _ := strings.Cut(l, "=")
			env[k] = v
		}
		close(lines)
		_, _ = io.Copy(io.Discard, pr)
	}()
	select {
	case <-lines:
	case <-time.After(60 * time.Second):
		t.Fatal("wb serve printed nothing in 60 s")
	}
	addrRe := regexp.MustCompile(`msg="ext_authz served" addr=(127\.0\.0\.1:\d+)`)
	testwait.For(t, 30*time.Second, "the ext_authz address in the log", func() bool { return addrRe.MatchString(logs.String()) })
	addr := addrRe.FindStringSubmatch(logs.String())[1]

	req, _ := http.NewRequest("POST", env["WB_URL"]+"/v1/sessions", strings.NewReader(`{"tier":2}`))
	req.Header.Set("Authorization", "Bearer "+env["WB_API_KEY"])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var sess struct {
		ID      string `json:"id"`
		Connect struct {
			ExecURL string `json:"exec_url"`
		} `json:"connect"`
	}
	err = json.NewDecoder(resp.Body).Decode(&sess)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 201 {
		t.Fatalf("create: %d %v", resp.StatusCode, err)
	}
	u, err := url.Parse(sess.Connect.ExecURL)
	if err != nil {
		t.Fatal(err)
	}

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := authv3.NewAuthorizationClient(conn)
	checkStatus := func(path, key string) (int, string) {
		t.Helper()
		hdr := map[string]string{}
		if key != "" {
			hdr["authorization"] = "Bearer " + key
		}
		cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
		defer ccancel()
		r, err := client.Check(cctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
			Http: &authv3.AttributeContext_HttpRequest{Method: "POST", Path: path, Headers: hdr}}}})
		if err != nil {
			t.Fatalf("Check %s: %v", path, err)
		}
		return int(r.GetDeniedResponse().GetStatus().GetCode()), r.GetDeniedResponse().GetBody()
	}
	if st, body := checkStatus("/v1/sessions/"+sess.ID+"/exec", env["WB_API_KEY"]); st != 409 || !strings.Contains(body, "session is pending") {
		t.Errorf("by key: %d %s, want 409 pending", st, body)
	}
	if st, body := checkStatus(u.RequestURI(), ""); st != 409 || !strings.Contains(body, "session is pending") {
		t.Errorf("by the connect URL's token: %d %s, want 409 pending", st, body)
	}
	if st, _ := checkStatus("/v1/sessions/sess_nope/exec", env["WB_API_KEY"]); st != 404 {
		t.Errorf("unknown session: %d, want 404", st)
	}
	if st, _ := checkStatus("/v1/sessions/"+sess.ID+"/exec", "wb_live_nope"); st != 401 {
		t.Errorf("bad key: %d, want 401", st)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve returned %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop within 30 s of its context ending")
	}
}
