package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"wb/internal/mtls"
)

// fleetCertsCmd is `wb fleet-certs`: a throwaway fleet CA and its members' certificates, each
// naming its roles, for mutual TLS inside a fleet that tries the layout out
// (deploy/envoy/compose.yaml). A production fleet's CA is the operator's.
func fleetCertsCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("wb fleet-certs", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "", "`dir` to write ca.pem and each MEMBER's NAME.pem and NAME-key.pem in (required)")
	valid := fs.Duration("valid", 365*24*time.Hour, "how long the certificates are valid")
	keep := fs.Bool("keep", false, "do nothing if --dir already holds a CA (ca.pem): a restart keeps the certificates every member loaded")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: wb fleet-certs --dir DIR [flags] MEMBER...

Mints a throwaway CA (DIR/ca.pem; its key is not kept) and, for each MEMBER, a certificate
of it with its roles, for --fleet-tls-*, --envoy-tls-*, --xds-tls-* and wb envoy-bootstrap
--tls-*. MEMBER is NAME=ROLE[+ROLE...][@IP[,IP...]]: ROLE is node, gateway or envoy (the
URI SANs spiffe://wb/ROLE that each hop checks), and a node's certificate must name the IP
it advertises. For example:
  wb fleet-certs --dir tls node-1=node@10.0.0.11 gateway-1=gateway@10.0.1.1 envoy=envoy

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" {
		return errors.New("--dir is required")
	}
	if fs.NArg() == 0 {
		return errors.New("give at least one MEMBER (NAME=ROLE[+ROLE...][@IP[,IP...]])")
	}
	members := make([]mtls.Member, 0, fs.NArg())
	for _, a := range fs.Args() {
		m, err := parseMember(a)
		if err != nil {
			return err
		}
		members = append(members, m)
	}
	if *keep {
		if _, err := os.Stat(filepath.Join(*dir, "ca.pem")); err == nil {
			fmt.Fprintf(stdout, "%s holds a CA already; kept\n", *dir)
			return nil
		}
	}
	if err := mtls.Mint(*dir, *valid, members); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "minted %s/ca.pem and %d members' certificates\n", *dir, len(members))
	return nil
}

// parseMember reads NAME=ROLE[+ROLE...][@IP[,IP...]].
func parseMember(s string) (mtls.Member, error) {
	name, rest, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return mtls.Member{}, fmt.Errorf("member %q: want NAME=ROLE[+ROLE...][@IP[,IP...]]", s)
	}
	roles, ips, _ := strings.Cut(rest, "@")
	m := mtls.Member{Name: name}
	for _, r := range strings.Split(roles, "+") {
		switch r {
		case "node":
			m.Roles = append(m.Roles, mtls.RoleNode)
		case "gateway":
			m.Roles = append(m.Roles, mtls.RoleGateway)
		case "envoy":
			m.Roles = append(m.Roles, mtls.RoleEnvoy)
		default:
			return mtls.Member{}, fmt.Errorf("member %q: role %q: want node, gateway or envoy", s, r)
		}
	}
	if ips != "" {
		for _, a := range strings.Split(ips, ",") {
			ip := net.ParseIP(a)
			if ip == nil {
				return mtls.Member{}, fmt.Errorf("member %q: %q is not an IP address", s, a)
			}
			m.IPs = append(m.IPs, ip)
		}
	}
	return m, nil
}
