package xds

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"wb/internal/mtls"
)

// ClusterXDS is the bootstrap's one static cluster: the xDS servers.
const ClusterXDS = "wb_xds"

// BootstrapOptions describe one Envoy of the fleet.
type BootstrapOptions struct {
	NodeID string
	// XDS lists the xDS servers (`wb serve --xds-addr` of each gateway) as host:port,
	// comma-separated; hosts may be DNS names.
	XDS string
	// TLS to the xDS servers: CA to verify them (their certificates must also name the
	// gateway role, mtls.RoleGateway), and a client certificate; all three or none.
	CAFile, CertFile, KeyFile string
	// SDSDir, with the TLS files, is an absolute directory on the Envoy's host holding the
	// SDS files of BootstrapSecrets: the xDS cluster then takes its certificate and CA by SDS
	// from them, and Envoy reads the certificate files again when they are rotated. Without
	// it the cluster names the files itself, and Envoy reads them once, at start.
	SDSDir string
	// AdminPort is the admin interface's port, bound to 127.0.0.1 only (default 9901).
	AdminPort uint32
}

// The SDS secrets of the xDS cluster (BootstrapOptions.SDSDir), each in a file of its name
// and ".yaml".
const (
	secretXDSClient = "wb_xds_client"
	secretXDSCA     = "wb_xds_ca"
)

// tlsFiles answers whether o asks for TLS to the xDS servers, and refuses a part of it.
func (o BootstrapOptions) tlsFiles() (bool, error) {
	n := 0
	for _, f := range []string{o.CAFile, o.CertFile, o.KeyFile} {
		if f != "" {
			n++
		}
	}
	switch {
	case n != 0 && n != 3:
		return false, errors.New("--tls-ca, --tls-cert and --tls-key go together: give all three or none")
	case o.SDSDir != "" && n == 0:
		return false, errors.New("--sds-dir: applies to --tls-ca, --tls-cert and --tls-key, which are not given")
	case o.SDSDir != "" && !filepath.IsAbs(o.SDSDir):
		return false, fmt.Errorf("--sds-dir %q: must be an absolute path (Envoy reads it from wherever it runs)", o.SDSDir)
	}
	return n == 3, nil
}

// BootstrapSecrets are the SDS files of o.SDSDir, by file name: each holds one Secret, as
// Envoy reads it from a file (a DiscoveryResponse in YAML), naming the files of o.CertFile and
// o.KeyFile, or of o.CAFile. Envoy watches the directories of the files an SDS secret names
// (reading them again when a file is moved into them, as a rotation renames its new files into
// place): the secrets themselves never change.
func BootstrapSecrets(o BootstrapOptions) (map[string][]byte, error) {
	if _, err := o.tlsFiles(); err != nil {
		return nil, err
	}
	if o.SDSDir == "" {
		return nil, errors.New("--sds-dir: required for the SDS files")
	}
	files := map[string][]byte{}
	for _, s := range []*tlsv3.Secret{
		{Name: secretXDSClient, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: certificateFiles(o.CertFile, o.KeyFile)}},
		{Name: secretXDSCA, Type: &tlsv3.Secret_ValidationContext{ValidationContext: caFile(o.CAFile)}},
	} {
		if err := s.ValidateAll(); err != nil {
			return nil, fmt.Errorf("secret %s: %w", s.GetName(), err)
		}
		y, err := protoYAML(&discoveryv3.DiscoveryResponse{Resources: []*anypb.Any{mustAny(s)}})
		if err != nil {
			return nil, fmt.Errorf("secret %s: %w", s.GetName(), err)
		}
		files[s.GetName()+".yaml"] = y
	}
	return files, nil
}

// fileSDS asks for the secret name from its file in dir (BootstrapSecrets).
func fileSDS(dir, name string) *tlsv3.SdsSecretConfig {
	return &tlsv3.SdsSecretConfig{Name: name, SdsConfig: &corev3.ConfigSource{
		ConfigSourceSpecifier: &corev3.ConfigSource_PathConfigSource{PathConfigSource: &corev3.PathConfigSource{
			Path: filepath.Join(dir, name+".yaml"),
		}},
		ResourceApiVersion: corev3.ApiVersion_V3,
	}}
}

// Bootstrap is the Envoy bootstrap for one fleet member: every listener, route, cluster and
// endpoint comes over ADS from the xDS servers, which are the only static cluster.
func Bootstrap(o BootstrapOptions) (*bootstrapv3.Bootstrap, error) {
	if o.NodeID == "" {
		return nil, errors.New("--node-id: required (a name for this Envoy, unique in the fleet)")
	}
	if o.AdminPort == 0 {
		o.AdminPort = 9901
	}
	if o.AdminPort > 65535 {
		return nil, fmt.Errorf("--admin-port %d: must be 1–65535", o.AdminPort)
	}
	withTLS, err := o.tlsFiles()
	if err != nil {
		return nil, err
	}
	var xdsEndpoints []*endpointv3.LbEndpoint
	var firstHost string
	for _, hp := range strings.Split(o.XDS, ",") {
		hp = strings.TrimSpace(hp)
		if hp == "" {
			continue
		}
		host, port, err := net.SplitHostPort(hp)
		if err != nil {
			return nil, fmt.Errorf("--xds %q: want host:port[,host:port...]: %w", hp, err)
		}
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil || p == 0 || host == "" {
			return nil, fmt.Errorf("--xds %q: want host:port with a port 1–65535", hp)
		}
		if firstHost == "" {
			firstHost = host
		}
		xdsEndpoints = append(xdsEndpoints, &endpointv3.LbEndpoint{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
			Address: socketAddress(host, uint32(p)),
		}}})
	}
	if len(xdsEndpoints) == 0 {
		return nil, errors.New("--xds: required (host:port of the xDS servers, comma-separated)")
	}
	xds := &clusterv3.Cluster{
		Name: ClusterXDS,
		// Names resolve (Compose services, DNS); addresses pass through.
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STRICT_DNS},
		ConnectTimeout:       durationpb.New(5 * time.Second),
		TypedExtensionProtocolOptions: map[string]*anypb.Any{
			"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": mustAny(&upstreamhttpv3.HttpProtocolOptions{
				UpstreamProtocolOptions: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig_{
					ExplicitHttpConfig: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig{
						ProtocolConfig: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
							// Keepalive pings find a dead xDS server before TCP does.
							Http2ProtocolOptions: &corev3.Http2ProtocolOptions{ConnectionKeepalive: &corev3.KeepaliveSettings{
								Interval: durationpb.New(30 * time.Second), Timeout: durationpb.New(5 * time.Second),
							}},
						},
					},
				},
			}),
		},
		LoadAssignment: &endpointv3.ClusterLoadAssignment{
			ClusterName: ClusterXDS,
			Endpoints:   []*endpointv3.LocalityLbEndpoints{{LbEndpoints: xdsEndpoints}},
		},
	}
	if withTLS {
		// The xDS servers are the gateways (wb serve --xds-addr, serving a gateway's
		// certificate): the CA's signature says only "a member of the fleet", and another
		// member's certificate (a node host's) must not serve an Envoy its listeners and
		// clusters.
		role := []*tlsv3.SubjectAltNameMatcher{uriSAN(mtls.RoleGateway)}
		common := &tlsv3.CommonTlsContext{
			TlsCertificates: []*tlsv3.TlsCertificate{{CertificateChain: fileSource(o.CertFile), PrivateKey: fileSource(o.KeyFile)}},
			ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
				TrustedCa: fileSource(o.CAFile), MatchTypedSubjectAltNames: role,
			}},
		}
		if o.SDSDir != "" {
			common = &tlsv3.CommonTlsContext{
				TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{fileSDS(o.SDSDir, secretXDSClient)},
				ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
					DefaultValidationContext:         &tlsv3.CertificateValidationContext{MatchTypedSubjectAltNames: role},
					ValidationContextSdsSecretConfig: fileSDS(o.SDSDir, secretXDSCA),
				}},
			}
		}
		xds.TransportSocket = &corev3.TransportSocket{
			Name:       "envoy.transport_sockets.tls",
			ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(&tlsv3.UpstreamTlsContext{Sni: firstHost, CommonTlsContext: common})},
		}
	}
	b := &bootstrapv3.Bootstrap{
		Node: &corev3.Node{Id: o.NodeID, Cluster: ListenerEdge},
		DynamicResources: &bootstrapv3.Bootstrap_DynamicResources{
			AdsConfig: &corev3.ApiConfigSource{
				ApiType:             corev3.ApiConfigSource_GRPC,
				TransportApiVersion: corev3.ApiVersion_V3,
				GrpcServices: []*corev3.GrpcService{{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{
					EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: ClusterXDS},
				}}},
				SetNodeOnFirstMessageOnly: true,
				// A control plane in trouble is not hammered by a fleet of retrying Envoys.
				RateLimitSettings: &corev3.RateLimitSettings{MaxTokens: wrapperspb.UInt32(100), FillRate: wrapperspb.Double(10)},
			},
			LdsConfig: adsSource(),
			CdsConfig: adsSource(),
		},
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{Clusters: []*clusterv3.Cluster{xds}},
		Admin: &bootstrapv3.Admin{
			// The admin interface can stop Envoy and dump its config: loopback only.
			Address: socketAddress("127.0.0.1", o.AdminPort),
		},
	}
	if err := b.ValidateAll(); err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	return b, nil
}

// BootstrapYAML is Bootstrap as the YAML Envoy reads with --config-path.
func BootstrapYAML(o BootstrapOptions) ([]byte, error) {
	b, err := Bootstrap(o)
	if err != nil {
		return nil, err
	}
	y, err := protoYAML(b)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	return y, nil
}

// protoYAML is m as block-style YAML, in the proto field names Envoy reads.
func protoYAML(m proto.Message) ([]byte, error) {
	j, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(j, &doc); err != nil { // JSON is YAML; keeps the field order
		return nil, err
	}
	setBlockStyle(&doc)
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// setBlockStyle turns the flow style that JSON parses into YAML's block style.
func setBlockStyle(n *yaml.Node) {
	n.Style &^= yaml.FlowStyle
	if n.Kind == yaml.ScalarNode && n.Style&yaml.DoubleQuotedStyle != 0 {
		n.Style &^= yaml.DoubleQuotedStyle
	}
	for _, c := range n.Content {
		setBlockStyle(c)
	}
}

// ParseBootstrapYAML reads a bootstrap written by BootstrapYAML (for tests and checks).
func ParseBootstrapYAML(y []byte) (*bootstrapv3.Bootstrap, error) {
	var v any
	if err := yaml.Unmarshal(y, &v); err != nil {
		return nil, err
	}
	j, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(j, &b); err != nil {
		return nil, err
	}
	return &b, b.ValidateAll()
}

func socketAddress(host string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}
