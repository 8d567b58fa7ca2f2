package xds

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
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
	// AdminPort is the admin interface's port, bound to 127.0.0.1 only (default 9901).
	AdminPort uint32
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
	tlsSet := 0
	for _, f := range []string{o.CAFile, o.CertFile, o.KeyFile} {
		if f != "" {
			tlsSet++
		}
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
	switch tlsSet {
	case 0:
	case 3:
		ctx := &tlsv3.UpstreamTlsContext{
			Sni: firstHost,
			CommonTlsContext: &tlsv3.CommonTlsContext{
				TlsCertificates: []*tlsv3.TlsCertificate{{
					CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: o.CertFile}},
					PrivateKey:       &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: o.KeyFile}},
				}},
				// The xDS servers are the gateways (wb serve --xds-addr, serving a gateway's
				// certificate): the CA's signature says only "a member of the fleet", and
				// another member's certificate (a node host's) must not serve an Envoy its
				// listeners and clusters.
				ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
					TrustedCa:                 &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: o.CAFile}},
					MatchTypedSubjectAltNames: []*tlsv3.SubjectAltNameMatcher{uriSAN(mtls.RoleGateway)},
				}},
			},
		}
		xds.TransportSocket = &corev3.TransportSocket{
			Name:       "envoy.transport_sockets.tls",
			ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(ctx)},
		}
	default:
		return nil, errors.New("--tls-ca, --tls-cert and --tls-key go together: give all three or none")
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
	j, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(j, &doc); err != nil { // JSON is YAML; keeps the field order
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	setBlockStyle(&doc)
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	return out.Bytes(), enc.Close()
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
