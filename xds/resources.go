package xds

import (
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"wb/internal/edgeauth"
	"wb/internal/mtls"
	"wb/session"
)

// Options shape the resources; the zero value of a field takes its default.
type Options struct {
	// ListenerPort is where wb_edge listens on every Envoy (default 10000).
	ListenerPort uint32
	// ExecTimeout bounds an exec request (default: the longest exec the API allows plus a
	// minute, so that the node, not Envoy, ends an exec that runs out its timeout_s).
	ExecTimeout time.Duration
	// FilesTimeout bounds a file upload or download (default 10 minutes).
	FilesTimeout time.Duration
	// PTYIdleTimeout ends a PTY with no frames either way (default: the longest idle timeout
	// a session may have, after which the session itself is stopped).
	PTYIdleTimeout time.Duration
	// PTYMaxDuration ends any PTY stream (default: the longest lifetime a session may have).
	PTYMaxDuration time.Duration
	// ConnectTimeout is the upstream connect timeout of every cluster (default 5 s).
	ConnectTimeout time.Duration
	// HealthInterval is the period of the nodes' active health checks (default 5 s).
	HealthInterval time.Duration
	// UpstreamTLS, when set, has Envoy speak mutual TLS to ext_authz, the gateways (at their
	// EdgeAddr) and the nodes (wb serve --envoy-tls-*); the zero value speaks plaintext.
	UpstreamTLS UpstreamTLS
}

// UpstreamTLS are files on the Envoys' hosts: the client certificate and key an Envoy
// presents to the gateways' ext_authz and --edge-addr and to the nodes (which serve
// --fleet-tls-*), and the fleet's CA that must have signed their certificates. The clusters
// take them by SDS over ADS (the secrets SecretEnvoyClient and SecretFleetCA name the files),
// so that Envoy watches the files' directories and reads a rotated certificate again: files
// named in a cluster itself are read once, when it is built. The control plane only names
// the files: the Envoys' key never passes through it.
type UpstreamTLS struct {
	CertFile, KeyFile, CAFile string
}

func (u UpstreamTLS) enabled() bool { return u != UpstreamTLS{} }

func (o Options) withDefaults() Options {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if o.ListenerPort == 0 {
		o.ListenerPort = 10000
	}
	def(&o.ExecTimeout, time.Duration(session.ExecTimeoutMaxS)*time.Second+time.Minute)
	def(&o.FilesTimeout, 10*time.Minute)
	def(&o.PTYIdleTimeout, time.Duration(session.IdleTimeoutMaxS)*time.Second)
	def(&o.PTYMaxDuration, time.Duration(session.LifetimeMaxS)*time.Second)
	def(&o.ConnectTimeout, 5*time.Second)
	def(&o.HealthInterval, 5*time.Second)
	return o
}

// Validate rejects options no Envoy would accept.
func (o Options) Validate() error {
	if o.ListenerPort > 65535 {
		return fmt.Errorf("listener port %d: must be 1–65535", o.ListenerPort)
	}
	if u := o.UpstreamTLS; u.enabled() && (u.CertFile == "" || u.KeyFile == "" || u.CAFile == "") {
		return errors.New("upstream TLS: the certificate, key and CA files go together: give all three or none")
	}
	return nil
}

// Resources are one fleet's xDS resources, each list sorted by name.
type Resources struct {
	Listeners []*listenerv3.Listener
	Routes    []*routev3.RouteConfiguration
	Clusters  []*clusterv3.Cluster
	Endpoints []*endpointv3.ClusterLoadAssignment
	// Secrets are the SDS secrets the clusters name (with Options.UpstreamTLS only).
	Secrets []*tlsv3.Secret
	// Skipped says which fleet members were left out and why (bad or duplicate addresses).
	Skipped []string
}

// Build computes the Envoys' resources for a fleet. It is pure: the same fleet and options
// give the same resources, whatever the order of the fleet's lists. Members whose addresses
// cannot be used are left out and named in Skipped; nothing in a fleet makes Build fail.
func Build(f Fleet, opts Options) *Resources { return build(f, opts, false) }

// BuildGRPC are Build's resources for gRPC's xDS clients, which refuse Build's TLS clusters:
// gRPC takes a cluster's certificates only from certificate provider instances of its own
// bootstrap, and refuses SDS, TLS parameters and inline files, while Envoy does not implement
// those instances (and would ignore SDS beside one), so no one cluster serves both. With
// Options.UpstreamTLS the clusters take the client certificate and the CA from the instance
// GRPCCertProvider (a gRPC client's bootstrap maps it to files, e.g. with the file_watcher
// plugin, which reads rotated files again) and match the same SANs in the field gRPC reads;
// there are no secrets.
func BuildGRPC(f Fleet, opts Options) *Resources { return build(f, opts, true) }

func build(f Fleet, opts Options, forGRPC bool) *Resources {
	upstreamTLS := upstreamTLS
	if forGRPC {
		upstreamTLS = grpcUpstreamTLS
	}
	o := opts.withDefaults()
	nodes, gwHTTP, gwAuthz, skipped := parseFleet(f, o.UpstreamTLS.enabled())
	r := &Resources{Skipped: skipped}

	r.Listeners = []*listenerv3.Listener{edgeListener(o), grpcNodesListener()}
	r.Routes = []*routev3.RouteConfiguration{edgeRoutes(o)}

	r.Clusters = append(r.Clusters,
		edsCluster(ClusterExtAuthz, o, func(c *clusterv3.Cluster) {
			c.TypedExtensionProtocolOptions = map[string]*anypb.Any{
				"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": mustAny(&upstreamhttpv3.HttpProtocolOptions{
					UpstreamProtocolOptions: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig_{
						ExplicitHttpConfig: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig{
							ProtocolConfig: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
								Http2ProtocolOptions: &corev3.Http2ProtocolOptions{},
							},
						},
					},
				}),
			}
			c.OutlierDetection = outlier()
			// Only a gateway's certificate: the gateways' addresses come from Redis, where a
			// compromised node host could register a "gateway" at its own address, and is
			// sent the callers' API keys (as the gateway cluster's is).
			c.TransportSocket = upstreamTLS(o.UpstreamTLS, []string{"h2"}, uriSAN(mtls.RoleGateway)) // gRPC
		}),
		// With TLS, the endpoints are the gateways' --edge-addr, not their public listener,
		// which callers reach without a client certificate.
		edsCluster(ClusterGateway, o, func(c *clusterv3.Cluster) {
			c.OutlierDetection = outlier()
			c.TransportSocket = upstreamTLS(o.UpstreamTLS, nil, uriSAN(mtls.RoleGateway))
		}),
		// Many nodes' endpoints: the role, not one IP.
		edsCluster(ClusterNodes, o, func(c *clusterv3.Cluster) {
			c.TransportSocket = upstreamTLS(o.UpstreamTLS, nil, uriSAN(mtls.RoleNode))
		}),
	)
	r.Endpoints = append(r.Endpoints,
		assignment(ClusterExtAuthz, gwAuthz, nil),
		assignment(ClusterGateway, gwHTTP, nil),
	)
	var serving []netip.AddrPort
	for _, n := range nodes {
		r.Clusters = append(r.Clusters, edsCluster(n.cluster, o, func(c *clusterv3.Cluster) {
			c.HealthChecks = []*corev3.HealthCheck{{
				Timeout:            durationpb.New(2 * time.Second),
				Interval:           durationpb.New(o.HealthInterval),
				UnhealthyThreshold: wrapperspb.UInt32(3),
				HealthyThreshold:   wrapperspb.UInt32(1),
				HealthChecker: &corev3.HealthCheck_HttpHealthCheck_{HttpHealthCheck: &corev3.HealthCheck_HttpHealthCheck{
					Path: "/healthz",
				}},
			}}
			c.OutlierDetection = outlier()
			// One endpoint per cluster: with the default panic threshold Envoy would send
			// traffic to it even when unhealthy; fail fast with a 503 instead.
			c.CommonLbConfig = &clusterv3.Cluster_CommonLbConfig{HealthyPanicThreshold: &typev3.Percent{Value: 0}}
			// HTTP/1.1: the PTY is a WebSocket upgrade. The node's certificate must name its
			// IP, as the gateways' client checks: another member's does not pass for it.
			// Envoy accepts a certificate that any one SAN matcher matches, so the node role
			// cannot be required beside the IP: the IP is the narrower check (only this
			// node's certificates name it).
			c.TransportSocket = upstreamTLS(o.UpstreamTLS, nil, ipSAN(n.addr.Addr()))
		}))
		status := corev3.HealthStatus_UNKNOWN
		if n.draining {
			status = corev3.HealthStatus_DRAINING
		} else {
			serving = append(serving, n.addr)
		}
		r.Endpoints = append(r.Endpoints, assignment(n.cluster, []netip.AddrPort{n.addr}, &status))
	}
	r.Endpoints = append(r.Endpoints, assignment(ClusterNodes, dedupe(serving), nil))
	if !forGRPC {
		r.Secrets = upstreamSecrets(o.UpstreamTLS)
	}
	sortByName(r)
	return r
}

// edgeListener is wb_edge: HTTP connection manager → ext_authz → router, routes by RDS.
func edgeListener(o Options) *listenerv3.Listener {
	authz := &extauthzv3.ExtAuthz{
		Services: &extauthzv3.ExtAuthz_GrpcService{GrpcService: &corev3.GrpcService{
			TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: ClusterExtAuthz}},
			Timeout:         durationpb.New(time.Second),
		}},
		TransportApiVersion: corev3.ApiVersion_V3,
		FailureModeAllow:    false,
		// The authorization service chooses the node: the route is resolved again after it
		// set x-wb-cluster (only that header matters to routing).
		ClearRouteCache:        true,
		ClearRouteCacheHeaders: []string{edgeauth.HeaderCluster},
		StatPrefix:             "wb",
	}
	hcm := &hcmv3.HttpConnectionManager{
		StatPrefix: ListenerEdge,
		CodecType:  hcmv3.HttpConnectionManager_AUTO,
		// Envoy is the edge: the client's address is the peer's, and every caller is external,
		// so internal_only_headers (x-wb-cluster, x-wb-edge-auth) are stripped from them.
		UseRemoteAddress: wrapperspb.Bool(true),
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			RouteConfigName: RouteConfigEdge,
			ConfigSource:    adsSource(),
		}},
		HttpFilters: []*hcmv3.HttpFilter{
			{Name: "envoy.filters.http.ext_authz", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(authz)}},
			{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&routerv3.Router{})}},
		},
	}
	return &listenerv3.Listener{
		Name: ListenerEdge,
		Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: "0.0.0.0", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: o.ListenerPort},
		}}},
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
			Name:       "envoy.filters.network.http_connection_manager",
			ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(hcm)},
		}}}},
	}
}

// toGateway routes paths under prefix to the gateways, with timeout, without ext_authz.
func toGateway(name, prefix string, timeout time.Duration) *routev3.Route {
	return &routev3.Route{
		Name:  name,
		Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: prefix}},
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{
			ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: ClusterGateway},
			Timeout:          durationpb.New(timeout),
			IdleTimeout:      durationpb.New(timeout),
		}},
		// No ext_authz runs here, so nothing may reach the gateway as if it had.
		RequestHeadersToRemove: []string{edgeauth.HeaderCluster, edgeauth.HeaderEdgeAuth},
		TypedPerFilterConfig: map[string]*anypb.Any{
			"envoy.filters.http.ext_authz": mustAny(&extauthzv3.ExtAuthzPerRoute{Override: &extauthzv3.ExtAuthzPerRoute_Disabled{Disabled: true}}),
		},
	}
}

// edgeRoutes is wb_routes: exec, PTY and files to the node ext_authz named, every other /v1/
// route and the web console to the gateways without ext_authz (the gateway authenticates its
// own API; the console's pages call it with the user's key).
func edgeRoutes(o Options) *routev3.RouteConfiguration {
	toNode := func(a *routev3.RouteAction) *routev3.Route_Route {
		a.ClusterSpecifier = &routev3.RouteAction_ClusterHeader{ClusterHeader: edgeauth.HeaderCluster}
		return &routev3.Route_Route{Route: a}
	}
	sessionPath := func(verb string) *routev3.RouteMatch_SafeRegex {
		return &routev3.RouteMatch_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: `^/v1/sessions/[^/]+/` + verb + `$`}}
	}
	method := func(re string) []*routev3.HeaderMatcher {
		return []*routev3.HeaderMatcher{{Name: ":method", HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{
			StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: re}}},
		}}}
	}
	routes := []*routev3.Route{
		{
			Name:  "exec",
			Match: &routev3.RouteMatch{PathSpecifier: sessionPath("exec"), Headers: method("^POST$")},
			// A streamed exec may stay silent for its whole timeout: the idle timeout matches.
			Action: toNode(&routev3.RouteAction{Timeout: durationpb.New(o.ExecTimeout), IdleTimeout: durationpb.New(o.ExecTimeout)}),
		},
		{
			Name:  "pty",
			Match: &routev3.RouteMatch{PathSpecifier: sessionPath("pty"), Headers: method("^GET$")},
			Action: toNode(&routev3.RouteAction{
				UpgradeConfigs:    []*routev3.RouteAction_UpgradeConfig{{UpgradeType: "websocket", Enabled: wrapperspb.Bool(true)}},
				Timeout:           durationpb.New(0), // a terminal has no response deadline
				IdleTimeout:       durationpb.New(o.PTYIdleTimeout),
				MaxStreamDuration: &routev3.RouteAction_MaxStreamDuration{MaxStreamDuration: durationpb.New(o.PTYMaxDuration)},
			}),
		},
		{
			Name:   "files",
			Match:  &routev3.RouteMatch{PathSpecifier: sessionPath("files"), Headers: method("^(GET|PUT|DELETE)$")},
			Action: toNode(&routev3.RouteAction{Timeout: durationpb.New(o.FilesTimeout), IdleTimeout: durationpb.New(o.FilesTimeout)}),
		},
		toGateway("gateway", "/v1/", o.ExecTimeout), // one-shot runs answer when their command ends: as long as an exec
		toGateway("console", "/console", 30*time.Second),
	}
	return &routev3.RouteConfiguration{
		Name: RouteConfigEdge,
		// Stripped from external requests before any filter runs; ext_authz also overwrites
		// them on every request it lets through.
		InternalOnlyHeaders: []string{edgeauth.HeaderCluster, edgeauth.HeaderEdgeAuth},
		VirtualHosts: []*routev3.VirtualHost{{
			Name:    "wb",
			Domains: []string{"*"},
			Routes:  routes,
		}},
	}
}

// grpcNodesListener is the API listener a gRPC xDS client resolves (xds:///wb_grpc_nodes).
// Its route table is inline: go-control-plane's Consistent() does not follow api_listener
// RDS references, and an inline table needs no RDS round trip.
func grpcNodesListener() *listenerv3.Listener {
	hcm := &hcmv3.HttpConnectionManager{
		StatPrefix: ListenerGRPCNodes,
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
			Name: ListenerGRPCNodes,
			VirtualHosts: []*routev3.VirtualHost{{
				Name:    "nodes",
				Domains: []string{"*"},
				Routes: []*routev3.Route{{
					Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
					Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: ClusterNodes}}},
				}},
			}},
		}},
		HttpFilters: []*hcmv3.HttpFilter{
			{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&routerv3.Router{})}},
		},
	}
	return &listenerv3.Listener{
		Name:        ListenerGRPCNodes,
		ApiListener: &listenerv3.ApiListener{ApiListener: mustAny(hcm)},
	}
}

func adsSource() *corev3.ConfigSource {
	return &corev3.ConfigSource{
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
		ResourceApiVersion:    corev3.ApiVersion_V3,
	}
}

func edsCluster(name string, o Options, tune func(*clusterv3.Cluster)) *clusterv3.Cluster {
	c := &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{EdsConfig: adsSource()},
		ConnectTimeout:       durationpb.New(o.ConnectTimeout),
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
	}
	if tune != nil {
		tune(c)
	}
	return c
}

// upstreamTLS is the transport socket of a cluster whose servers serve --fleet-tls-*: the
// Envoy's client certificate, and their certificates verified against the fleet's CA and
// naming san (a role's URI, or a node's IP). The certificate and the CA come by SDS
// (upstreamSecrets); the SAN matcher, which differs by cluster, stays in the cluster as the
// default validation context, which Envoy merges with the secret's. nil without u.
func upstreamTLS(u UpstreamTLS, alpn []string, san *tlsv3.SubjectAltNameMatcher) *corev3.TransportSocket {
	if !u.enabled() {
		return nil
	}
	ctx := &tlsv3.UpstreamTlsContext{CommonTlsContext: &tlsv3.CommonTlsContext{
		TlsParams:                      &tlsv3.TlsParameters{TlsMinimumProtocolVersion: tlsv3.TlsParameters_TLSv1_2},
		TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{{Name: SecretEnvoyClient, SdsConfig: adsSource()}},
		ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
			DefaultValidationContext:         &tlsv3.CertificateValidationContext{MatchTypedSubjectAltNames: []*tlsv3.SubjectAltNameMatcher{san}},
			ValidationContextSdsSecretConfig: &tlsv3.SdsSecretConfig{Name: SecretFleetCA, SdsConfig: adsSource()},
		}},
		AlpnProtocols: alpn,
	}}
	return &corev3.TransportSocket{
		Name:       "envoy.transport_sockets.tls",
		ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(ctx)},
	}
}

// grpcUpstreamTLS is upstreamTLS for gRPC's xDS clients (BuildGRPC): the certificate and
// the CA from the certificate provider instance GRPCCertProvider, and san in
// match_subject_alt_names, the only SAN field gRPC reads (it ignores the typed one; Envoy
// reads this deprecated field only without the typed one). gRPC matches it against every SAN
// of the certificate, of any type; the fleet's CA issues URIs and IPs only. gRPC ignores ALPN
// (it speaks h2) and refuses TLS parameters (it speaks TLS 1.2 or later). nil without u.
func grpcUpstreamTLS(u UpstreamTLS, _ []string, san *tlsv3.SubjectAltNameMatcher) *corev3.TransportSocket {
	if !u.enabled() {
		return nil
	}
	provider := &tlsv3.CertificateProviderPluginInstance{InstanceName: GRPCCertProvider}
	ctx := &tlsv3.UpstreamTlsContext{CommonTlsContext: &tlsv3.CommonTlsContext{
		TlsCertificateProviderInstance: provider,
		ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
			CaCertificateProviderInstance: provider,
			MatchSubjectAltNames:          []*matcherv3.StringMatcher{san.GetMatcher()},
		}},
	}}
	return &corev3.TransportSocket{
		Name:       "envoy.transport_sockets.tls",
		ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(ctx)},
	}
}

// upstreamSecrets are the SDS secrets of upstreamTLS: SecretEnvoyClient and SecretFleetCA,
// naming u's files. nil without u.
func upstreamSecrets(u UpstreamTLS) []*tlsv3.Secret {
	if !u.enabled() {
		return nil
	}
	return []*tlsv3.Secret{
		{Name: SecretEnvoyClient, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: certificateFiles(u.CertFile, u.KeyFile)}},
		{Name: SecretFleetCA, Type: &tlsv3.Secret_ValidationContext{ValidationContext: caFile(u.CAFile)}},
	}
}

// certificateFiles is a certificate and key read from files, again whenever a file is moved
// into the certificate's directory (as a rotation writes a new file and renames it into
// place, or Kubernetes swaps a secret volume's directory): Envoy then reads both and checks
// that neither changed between the reads, so it does not pair a new key with an old
// certificate. Without the watched directory Envoy watches each file's directory, the same
// for files in one directory. Only an SDS secret's files are watched.
func certificateFiles(cert, key string) *tlsv3.TlsCertificate {
	c := &tlsv3.TlsCertificate{CertificateChain: fileSource(cert), PrivateKey: fileSource(key)}
	if dir := filepath.Dir(cert); dir == filepath.Dir(key) {
		c.WatchedDirectory = &corev3.WatchedDirectory{Path: dir}
	}
	return c
}

// caFile is a validation context trusting the CA certificates of a file, read again whenever
// a file is moved into its directory (an SDS secret's only).
func caFile(ca string) *tlsv3.CertificateValidationContext {
	return &tlsv3.CertificateValidationContext{TrustedCa: fileSource(ca), WatchedDirectory: &corev3.WatchedDirectory{Path: filepath.Dir(ca)}}
}

func fileSource(name string) *corev3.DataSource {
	return &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: name}}
}

// uriSAN matches a certificate of role (a URI SAN, mtls.RoleGateway...).
func uriSAN(role string) *tlsv3.SubjectAltNameMatcher {
	return &tlsv3.SubjectAltNameMatcher{
		SanType: tlsv3.SubjectAltNameMatcher_URI,
		Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: role}},
	}
}

// ipSAN matches a certificate that names ip.
func ipSAN(ip netip.Addr) *tlsv3.SubjectAltNameMatcher {
	return &tlsv3.SubjectAltNameMatcher{
		SanType: tlsv3.SubjectAltNameMatcher_IP_ADDRESS,
		Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: ip.String()}},
	}
}

func outlier() *clusterv3.OutlierDetection {
	return &clusterv3.OutlierDetection{
		Consecutive_5Xx:    wrapperspb.UInt32(5),
		Interval:           durationpb.New(10 * time.Second),
		BaseEjectionTime:   durationpb.New(30 * time.Second),
		MaxEjectionPercent: wrapperspb.UInt32(100),
	}
}

// assignment is a cluster's endpoints in one locality, named and weighted because gRPC
// rejects a locality without an id and ignores one without a weight. status, when given,
// applies to every endpoint.
func assignment(cluster string, addrs []netip.AddrPort, status *corev3.HealthStatus) *endpointv3.ClusterLoadAssignment {
	loc := &endpointv3.LocalityLbEndpoints{Locality: &corev3.Locality{Region: "wb"}, LoadBalancingWeight: wrapperspb.UInt32(1)}
	for _, a := range addrs {
		ep := &endpointv3.LbEndpoint{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
			Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
				Address: a.Addr().String(), PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(a.Port())},
			}}},
		}}}
		if status != nil {
			ep.HealthStatus = *status
		}
		loc.LbEndpoints = append(loc.LbEndpoints, ep)
	}
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: cluster}
	if len(loc.LbEndpoints) > 0 {
		cla.Endpoints = []*endpointv3.LocalityLbEndpoints{loc}
	}
	return cla
}

// mustAny wraps a message this package builds; marshalling one cannot fail.
func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(fmt.Sprintf("xds: marshal %T: %v", m, err)) // a bug in this package, never input
	}
	return a
}

type (
	listenerT = listenerv3.Listener
	routeT    = routev3.RouteConfiguration
	clusterT  = clusterv3.Cluster
	endpointT = endpointv3.ClusterLoadAssignment
	secretT   = tlsv3.Secret
)
