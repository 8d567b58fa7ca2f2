package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"wb/xds"
)

// envoyBootstrap prints the Envoy bootstrap of one fleet member.
func envoyBootstrap(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("wb envoy-bootstrap", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o xds.BootstrapOptions
	var adminPort uint
	fs.StringVar(&o.NodeID, "node-id", "", "`id` of this Envoy, unique in the fleet (required)")
	fs.StringVar(&o.XDS, "xds", "", "`host:port[,host:port...]` of the xDS servers: each gateway's `wb serve --xds-addr` (required)")
	fs.StringVar(&o.CAFile, "tls-ca", "", "PEM `file` of the CA that signed the xDS servers' certificates, which must be of the gateway role (a URI SAN spiffe://wb/gateway) (with --tls-cert and --tls-key: TLS to xDS, which wb serve --xds-tls-* serves)")
	fs.StringVar(&o.CertFile, "tls-cert", "", "PEM `file` of this Envoy's client certificate for the xDS servers, signed by their --xds-tls-client-ca for the Envoy role (a URI SAN spiffe://wb/envoy)")
	fs.StringVar(&o.KeyFile, "tls-key", "", "PEM `file` of that certificate's private key")
	fs.StringVar(&o.SDSDir, "sds-dir", "", "absolute `dir` to write the SDS files of the xDS cluster's --tls-* in, on the Envoy's host (Envoy reads them at start): Envoy then reads the certificate files again when a rotation moves new ones into their directory; without it, it reads them once")
	fs.UintVar(&adminPort, "admin-port", 9901, "`port` of Envoy's admin interface, bound to 127.0.0.1 only")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: wb envoy-bootstrap --node-id ID --xds HOST:PORT [flags]

Prints the bootstrap YAML of one Envoy of the fleet (envoy --config-path FILE): ADS over
gRPC to the xDS servers, with rate limits; listeners, routes, clusters and endpoints all
come from xDS; the admin interface listens on loopback only. See deploy/envoy/.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("wb envoy-bootstrap takes no arguments, got %q", fs.Args())
	}
	if adminPort == 0 || adminPort > 65535 {
		return fmt.Errorf("--admin-port %d: must be 1–65535", adminPort)
	}
	o.AdminPort = uint32(adminPort)
	y, err := xds.BootstrapYAML(o)
	if err != nil {
		return err
	}
	if o.SDSDir != "" {
		files, err := xds.BootstrapSecrets(o)
		if err != nil {
			return err
		}
		for name, content := range files {
			if err := writeFileAtomic(filepath.Join(o.SDSDir, name), content, 0o644); err != nil {
				return fmt.Errorf("--sds-dir: %w", err)
			}
		}
	} else if o.CertFile != "" {
		fmt.Fprintln(stderr, "wb envoy-bootstrap: without --sds-dir, Envoy reads the --tls-* files once: rotating them takes an Envoy restart")
	}
	_, err = stdout.Write(y)
	return err
}

// writeFileAtomic writes a file whole or not at all (a temporary file renamed into place), so
// that an Envoy starting meanwhile reads no half-written SDS file.
func writeFileAtomic(path string, content []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a rename, removes nothing
	if _, err := tmp.Write(content); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
