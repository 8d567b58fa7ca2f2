// Package xds is the control plane of wb's Envoy fleet: it builds Envoy's resources from the
// fleet registered in Redis and serves them over ADS (state of the world and delta) with
// go-control-plane.
//
// What it publishes (one snapshot, the same for every Envoy node id, and its twin for gRPC's
// xDS clients, which differs only with TLS):
//
//   - listener wb_edge: HTTP connection manager → ext_authz (gRPC, cluster wb_ext_authz,
//     fail closed, no body) → router, routes by RDS wb_routes;
//   - route config wb_routes: POST .../exec, GET .../pty (WebSocket, timeout 0s, an idle
//     timeout and a max stream duration) and GET|PUT|DELETE .../files go to the cluster named
//     by x-wb-cluster, which ext_authz sets; every other /v1/ route goes to wb_gateway with
//     ext_authz disabled (the gateway authenticates its own API);
//   - clusters wb_gateway, wb_ext_authz (HTTP/2) and one EDS cluster per node,
//     NodeCluster(id) = wb_node_<id>, with HTTP health checks on /healthz and outlier
//     detection; a draining node's endpoint is DRAINING; with Options.UpstreamTLS, every
//     cluster speaks mutual TLS (an UpstreamTlsContext taking the Envoy's certificate and the
//     fleet's CA by SDS over ADS: the secrets SecretEnvoyClient and SecretFleetCA name files on
//     the Envoys' hosts, which Envoy reads again when they are rotated), and wb_gateway's
//     endpoints are the gateways' edge addresses; gRPC's xDS clients refuse such clusters
//     (they take certificate provider instances only, which Envoy does not implement), so
//     they, known by their node's user agent, are sent BuildGRPC's resources instead, whose
//     TLS clusters name the provider instance GRPCCertProvider of their bootstrap;
//   - listener wb_grpc_nodes with cluster wb_nodes: an API listener for gRPC xDS clients
//     (xds:///wb_grpc_nodes reaches the serving nodes). grpc-go's xDS client, the only real
//     consumer available on the build machines (there is no Envoy there), checks our server
//     through it in the tests; Envoy-only fields are checked by ValidateAll and goldens.
//
// Why the shapes:
//
//   - One cluster per node, never per session, and the node chosen by a header: creating or
//     ending a session changes nothing here; nodes joining, draining or leaving change CDS
//     and EDS only. The fleet is polled (one HGETALL of nodes, one of gateways, every 2 s)
//     and published only when the resources' content changes, so heartbeats and usage are
//     invisible.
//   - x-wb-cluster and x-wb-edge-auth can only come from ext_authz: they are
//     internal_only_headers (stripped from external requests before any filter; Envoy is the
//     edge, use_remote_address), ext_authz overwrites both on every request it allows, and
//     clears the route cache when it sets x-wb-cluster so the route is resolved with its
//     value; the gateway routes, where no ext_authz runs, remove both. A route-level
//     request_headers_to_remove alone would not do: the router applies it after ext_authz,
//     so it would delete ext_authz's own headers.
//   - Versions are hashes of each type's content: every replica and every restart gives the
//     same version for the same fleet, so a reconnecting Envoy is sent nothing it lacks.
//   - Nothing from Redis can break a snapshot: a member whose address is not IP:port (or an
//     http(s) URL with an IP host) is left out and logged. A snapshot that fails ValidateAll
//     or Consistent is not published; the last good one stays and the failure is counted
//     (wb_xds_snapshot_failures_total).
//   - NACKs are logged with the client's message and counted (wb_xds_nacks_total). The
//     snapshot cache alone would send a rejected version straight back, forever; a callback
//     makes it wait for the next snapshot instead (see Server.callbacks).
//
// Bootstrap builds each Envoy's bootstrap (wb envoy-bootstrap). deploy/envoy shows the
// production layout.
package xds
