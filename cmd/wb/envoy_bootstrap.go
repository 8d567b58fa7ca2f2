package main

import (
	"flag"
	"fmt"
	"io"

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
	_, err = stdout.Write(y)
	return err
}
