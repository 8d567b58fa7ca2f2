//go:build linux

package main

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"wb/internal/mtls"
)

// TestFleetCerts: wb fleet-certs mints the CA and each member with its roles and IPs, which
// a node's listener and a gateway's dialer accept of each other; --keep leaves a minted dir as
// it is; a malformed member is refused before anything is written.
func TestFleetCerts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	var out, errb strings.Builder
	if err := run(context.Background(), []string{"fleet-certs", "--dir", dir, "node-1=node@127.0.0.1", "gw=gateway+envoy@127.0.0.1"}, &out, &errb); err != nil {
		t.Fatalf("fleet-certs: %v (%s)", err, errb.String())
	}
	f := func(name string) fleetTLSFlags {
		return fleetTLSFlags{cert: filepath.Join(dir, name+".pem"), key: filepath.Join(dir, name+"-key.pem"), ca: filepath.Join(dir, "ca.pem")}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, _, err = nodeListener(ln, f("node-1"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	serveOK(t, ln)
	d, err := nodeDialer(f("gw"), nil)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{DialTLSContext: d.DialTLSContext}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("https://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatalf("the minted gateway calling the minted node: %v", err)
	}
	resp.Body.Close()
	before, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), []string{"fleet-certs", "--dir", dir, "--keep", "x=node"}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "ca.pem")); string(after) != string(before) {
		t.Error("--keep minted a new CA")
	}
	if _, err := os.Stat(filepath.Join(dir, "x.pem")); err == nil {
		t.Error("--keep minted a member")
	}
	for _, c := range []struct{ arg, want string }{
		{"node-1", "want NAME=ROLE"},
		{"n=admin", `role "admin"`},
		{"n=node@10.0.0.300", "not an IP address"},
	} {
		empty := filepath.Join(t.TempDir(), "tls")
		if err := run(context.Background(), []string{"fleet-certs", "--dir", empty, c.arg}, &out, &errb); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("member %q: %v, want an error with %q", c.arg, err, c.want)
		}
		if _, err := os.Stat(empty); err == nil {
			t.Errorf("member %q: the dir was written", c.arg)
		}
	}
}

// TestComposeTLS: deploy/envoy/compose.yaml's certs service mints every certificate the
// other services name, each with the role its flag needs, and each node's names the IP it
// advertises; every service that names one mounts the tls volume.
func TestComposeTLS(t *testing.T) {
	b, err := os.ReadFile("../../deploy/envoy/compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Services map[string]struct {
			Command any      `yaml:"command"`
			Volumes []string `yaml:"volumes"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	words := func(cmd any) []string {
		switch v := cmd.(type) {
		case string:
			return strings.Fields(v)
		case []any:
			var w []string
			for _, x := range v {
				s, _ := x.(string)
				w = append(w, strings.Fields(s)...)
			}
			return w
		}
		return nil
	}
	certs := words(c.Services["certs"].Command)
	if len(certs) < 2 || certs[0] != "fleet-certs" {
		t.Fatalf("the certs service runs %q, want wb fleet-certs", certs)
	}
	members := map[string]mtls.Member{}
	for _, a := range certs[1:] {
		if strings.HasPrefix(a, "--") || a == "/etc/wb/tls" {
			continue
		}
		m, err := parseMember(a)
		if err != nil {
			t.Fatal(err)
		}
		members[m.Name] = m
	}
	pathRe := regexp.MustCompile(`^/etc/wb/tls/(.+?)(-key)?\.pem$`)
	wantRole := map[string]string{"--fleet-tls-cert": "", "--envoy-tls-cert": mtls.RoleEnvoy, "--xds-tls-cert": mtls.RoleGateway, "--tls-cert": mtls.RoleEnvoy}
	for name, s := range c.Services {
		w := words(s.Command)
		named := false
		for i, a := range w {
			m := pathRe.FindStringSubmatch(a)
			if m == nil {
				continue
			}
			named = true
			if m[1] == "ca" {
				continue
			}
			mem, ok := members[m[1]]
			if !ok {
				t.Errorf("service %s names %s, which the certs service does not mint", name, a)
				continue
			}
			flag := ""
			if i > 0 {
				flag = w[i-1]
			}
			role, checked := wantRole[flag]
			if flag == "--fleet-tls-cert" {
				role = mtls.RoleGateway
				if slices.Contains(w, "node") {
					role = mtls.RoleNode
				}
			}
			if checked && !slices.Contains(mem.Roles, role) {
				t.Errorf("service %s: %s %s has roles %v, want %s", name, flag, a, mem.Roles, role)
			}
			if checked && role == mtls.RoleNode {
				adv := w[slices.Index(w, "--advertise")+1]
				if len(mem.IPs) != 1 || !strings.HasPrefix(adv, "https://"+mem.IPs[0].String()+":") {
					t.Errorf("service %s advertises %s, and its certificate names %v", name, adv, mem.IPs)
				}
			}
		}
		if named && name != "certs" && !strings.HasSuffix(name, "-bootstrap") && !slices.Contains(s.Volumes, "tls:/etc/wb/tls:ro") {
			t.Errorf("service %s names files in /etc/wb/tls, but mounts %v", name, s.Volumes)
		}
	}
	for _, n := range []string{"gateway-1", "gateway-2", "node-1", "node-2", "node-3"} {
		if !slices.Contains(words(c.Services[n].Command), "--fleet-tls-cert") {
			t.Errorf("service %s runs without --fleet-tls-*", n)
		}
	}
}
