//go:build linux

package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestEmbeddedRedis: the embedded Redis is a real redis-server on a Unix socket that only
// its owner may reach; it answers only a client that knows this start's password (each start
// has its own), and it ends with its parent.
func TestEmbeddedRedis(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed")
	}
	ctx := context.Background()
	dir := t.TempDir()
	var passwords []string
	var sock string
	for range 2 {
		rdb, closeRedis, err := openRedis(ctx, "", "", filepath.Join(dir, "redis"))
		if err != nil {
			t.Fatal(err)
		}
		if err := rdb.Ping(ctx).Err(); err != nil {
			t.Fatalf("wb's own client: %v", err)
		}
		info, err := rdb.Info(ctx, "server").Result()
		if err != nil || !strings.Contains(info, "redis_version:") {
			t.Fatalf("INFO server: %v %q; want a real redis-server", err, info)
		}
		opts := rdb.(*redis.Client).Options()
		sock = opts.Addr
		passwords = append(passwords, opts.Password)
		if opts.Network != "unix" {
			t.Errorf("embedded redis listens on %s %s, want a Unix socket", opts.Network, opts.Addr)
		}
		if st, err := os.Stat(filepath.Dir(sock)); err != nil || st.Mode().Perm() != 0o700 {
			t.Errorf("the socket's directory: %v %v; want mode 0700", st.Mode(), err)
		}
		if len(passwords) == 1 {
			for _, c := range []struct{ name, pw string }{{"no password", ""}, {"a wrong password", "nope"}} {
				intruder := redis.NewClient(&redis.Options{Network: "unix", Addr: sock, Password: c.pw, MaxRetries: -1})
				_, err := intruder.Keys(ctx, "*").Result()
				intruder.Close()
				if err == nil {
					t.Errorf("%s: KEYS * answered", c.name)
				}
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(sock), "redis.log")); err != nil {
				t.Errorf("the server's log: %v", err)
			}
		}
		closeRedis()
		if err := rdb.Ping(ctx).Err(); err == nil {
			t.Fatal("the client answers after close")
		}
	}
	if passwords[0] == "" || passwords[0] == passwords[1] {
		t.Fatalf("passwords %q: want a different random one per start", passwords)
	}
	if c, err := net.Dial("unix", sock); err == nil {
		c.Close()
		t.Fatal("the embedded server still listens after close")
	}
}

func TestRedisURLs(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, c := range []struct {
		url, user, pw string
		tls           bool
		cluster       []string
		err           string
	}{
		{url: "redis://127.0.0.1:6379/0"},
		{url: "redis://wb:s3cret@127.0.0.1:6379/2", user: "wb", pw: "s3cret"},
		{url: "rediss://:s3cret@redis.example:6380/0", pw: "s3cret", tls: true},
		{url: "redis://wb:pw@h1:7000,h2:7001,h3:7002", user: "wb", pw: "pw", cluster: []string{"h1:7000", "h2:7001", "h3:7002"}},
		{url: "rediss://wb:pw@h1:7000,h2:7001/0", user: "wb", pw: "pw", tls: true, cluster: []string{"h1:7000", "h2:7001"}},
		{url: "http://127.0.0.1:6379", err: `scheme "http"`},
		{url: "127.0.0.1:6379", err: "redis://"},
	} {
		rdb, err := dialRedis(c.url, "")
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want one with %q", c.url, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.url, err)
			continue
		}
		var user, pw string
		var tls bool
		var dial func(context.Context, string, string) (net.Conn, error)
		switch r := rdb.(type) {
		case *redis.Client:
			o := r.Options()
			user, pw, tls, dial = o.Username, o.Password, o.TLSConfig != nil, o.Dialer
			if c.cluster != nil {
				t.Errorf("%s: a single client, want a Cluster", c.url)
			}
		case *redis.ClusterClient:
			o := r.Options()
			user, pw, tls, dial = o.Username, o.Password, o.TLSConfig != nil, o.Dialer
			if strings.Join(o.Addrs, ",") != strings.Join(c.cluster, ",") {
				t.Errorf("%s: cluster seeds %v, want %v", c.url, o.Addrs, c.cluster)
			}
			// A replica that took over from a killed primary is found within a second, not
			// go-redis's default minute.
			if o.ClusterStateReloadInterval != clusterReloadInterval || clusterReloadInterval > time.Second {
				t.Errorf("%s: the slot map is reloaded every %v, want every %v (at most 1s)", c.url, o.ClusterStateReloadInterval, clusterReloadInterval)
			}
		}
		rdb.Close()
		if user != c.user || pw != c.pw || tls != c.tls {
			t.Errorf("%s: user %q password %q tls %v; want %q %q %v", c.url, user, pw, tls, c.user, c.pw, c.tls)
		}
		if !tls && dial == nil {
			t.Errorf("%s: the client dials with go-redis's own dialer, whose connections it peeks at before every command (want redisconn.Dialer)", c.url)
		} else if !tls {
			// go-redis peeks at a syscall.Conn's socket before every command.
			conn, err := dial(context.Background(), "tcp", l.Addr().String())
			if err != nil {
				t.Fatalf("%s: dial: %v", c.url, err)
			}
			if _, peeks := conn.(syscall.Conn); peeks {
				t.Errorf("%s: the client's connections are a %T, which go-redis peeks at (want redisconn.Dialer's)", c.url, conn)
			}
			conn.Close()
		}
		if c.pw != "" && strings.Contains(redisLabel(c.url), c.pw) {
			t.Errorf("%s: the label %q shows the password", c.url, redisLabel(c.url))
		}
	}
	if _, _, err := openRedis(context.Background(), "redis://wb:hunter2@127.0.0.1:1,x", "", ""); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("an error names the password: %v", err)
	}
}

// TestRedisPasswordAndTLS: a real redis-server with TLS only, a password and an ACL user;
// wb connects with rediss:// and --redis-ca, and not without the right password or CA.
func TestRedisPasswordAndTLS(t *testing.T) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server is not installed")
	}
	dir := t.TempDir()
	caFile, otherCA := writeTestPKI(t, dir)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(bin, "--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--tls-cert-file", filepath.Join(dir, "server.crt"), "--tls-key-file", filepath.Join(dir, "server.key"),
		"--tls-ca-cert-file", caFile, "--tls-auth-clients", "no", "--requirepass", "default-pw",
		"--save", "", "--appendonly", "no", "--dir", dir)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	ctx := context.Background()
	base := fmt.Sprintf("127.0.0.1:%d/0", port)
	ping := func(url, ca string) error {
		rdb, closeRedis, err := openRedis(context.Background(), url, ca, "")
		if err != nil {
			return err
		}
		defer closeRedis()
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return rdb.Ping(pctx).Err()
	}
	deadline := time.Now().Add(30 * time.Second)
	for err := ping("rediss://:default-pw@"+base, caFile); err != nil; err = ping("rediss://:default-pw@"+base, caFile) {
		if time.Now().After(deadline) {
			t.Fatalf("redis-server with TLS never answered: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	admin, closeAdmin, err := openRedis(context.Background(), "rediss://:default-pw@"+base, caFile, "")
	if err != nil {
		t.Fatal(err)
	}
	defer closeAdmin()
	if err := admin.Do(ctx, "ACL", "SETUSER", "wb", "on", ">wb-pw", "~*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	if err := ping("rediss://wb:wb-pw@"+base, caFile); err != nil {
		t.Errorf("ACL user over TLS: %v", err)
	}
	for _, c := range []struct{ name, url, ca string }{
		{"wrong password", "rediss://wb:nope@" + base, caFile},
		{"no password", "rediss://" + base, caFile},
		{"plain text to the TLS port", "redis://:default-pw@" + base, ""},
		{"a CA that did not sign the server", "rediss://:default-pw@" + base, otherCA},
	} {
		if err := ping(c.url, c.ca); err == nil {
			t.Errorf("%s: connected", c.name)
		}
	}
}

// writeTestPKI writes a CA, a server certificate for 127.0.0.1 signed by it, and a second,
// unrelated CA; it returns the two CA files.
func writeTestPKI(t *testing.T, dir string) (caFile, otherCA string) {
	t.Helper()
	newCA := func(name string) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
		der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
		if err != nil {
			t.Fatal(err)
		}
		cert, _ := x509.ParseCertificate(der)
		return cert, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	}
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ca, caKey, caPEM := newCA("wb test CA")
	_, _, otherPEM := newCA("someone else's CA")
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "redis"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	write("server.crt", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	write("server.key", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}))
	return write("ca.crt", caPEM), write("other-ca.crt", otherPEM)
}
