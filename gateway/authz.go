package gateway

import (
	"context"
	"encoding/json"
	"net/url"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"wb/internal/edgeauth"
	"wb/session"
)

// Authz is the gateway's ext_authz service (envoy.service.auth.v3.Authorization), which the
// Envoy fleet asks before it sends an exec, PTY or files request straight to the node that
// runs the session. It answers as the gateway's own handlers would:
//
//   - the caller is a project by its API key (Authorization: Bearer, through the same auth
//     cache as the HTTP API) or the holder of a connect token (query parameter token) for the
//     session in the path; else 401;
//   - the session is the caller's (else 404, the same for another project's session as for
//     none), running (else 409 naming its state, the handlers' message) and placed on a node;
//   - then OK, with x-wb-cluster (the node's Envoy cluster, for the route's cluster_header)
//     and x-wb-edge-auth (an edge grant for the session, its project and its node, which the
//     node checks; it says whether the caller came by connect token), each replacing
//     whatever the caller sent under that name.
//
// A denial carries the HTTP API's status and JSON error body. The path is left as it came,
// token included. Every other request is allowed with nothing added: ext_authz is disabled
// on the routes that go to the gateways, which authenticate their API themselves.
type Authz struct {
	authv3.UnimplementedAuthorizationServer
	s *Server
}

// Authz returns the Server's ext_authz service, reading the shared edge secret now (so that
// a gateway that cannot sign fails at start, not on Envoy's first request) and starting the
// tail of session events that keeps its lookups fresh, until Close.
func (s *Server) Authz(ctx context.Context) (*Authz, error) {
	if _, err := s.signers(ctx); err != nil {
		return nil, err
	}
	s.access.watch.Do(func() { go s.watchSessions(s.ctx) })
	return &Authz{s: s}, nil
}

// Register adds the service to g.
func (a *Authz) Register(g *grpc.Server) { authv3.RegisterAuthorizationServer(g, a) }

// Check decides one request. It never answers a gRPC error: a failure of Redis is a denial
// with the API's 500 body, so that Envoy shows the caller what the API would.
func (a *Authz) Check(ctx context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	s := a.s
	h := req.GetAttributes().GetRequest().GetHttp()
	route, ok := parseDataRoute(h.GetMethod(), h.GetPath())
	if !ok {
		return allowUnrouted(), nil
	}
	_, rawQuery, _ := strings.Cut(h.GetPath(), "?")
	query, _ := url.ParseQuery(rawQuery) // as net/http does: what parses is used
	c, err := s.identify(ctx, requestHeader(h, "authorization"), query.Get(connectTokenParam), route.sessionID)
	if err != nil {
		return s.deny(ctx, err), nil
	}
	f, err := s.lookupSession(ctx, c.project.ID, route.sessionID)
	switch {
	case err != nil:
	case !f.found:
		err = errNotFound("session", route.sessionID)
	case f.state != session.Running:
		err = errNeedsRunning(route.op, f.state)
	case f.nodeID == "":
		err = &apiError{Status: 503, Type: "api_error", Code: "no_node", RetryAfter: time.Second,
			Message: "the session is running but no node is recorded for it; retry shortly"}
	}
	if err != nil {
		return s.deny(ctx, err), nil
	}
	sg, err := s.signers(ctx)
	if err != nil {
		return s.deny(ctx, err), nil
	}
	grant := sg.edge.Sign(edgeauth.Grant{SessionID: route.sessionID, ProjectID: c.project.ID, NodeID: f.nodeID,
		ByToken: c.byToken, Expires: s.Now().Add(EdgeGrantTTL).Unix()})
	return &authv3.CheckResponse{
		Status: &rpcstatus.Status{Code: int32(codes.OK)},
		HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{
			Headers: []*corev3.HeaderValueOption{
				overwrite(edgeauth.HeaderCluster, edgeauth.NodeCluster(f.nodeID)),
				overwrite(edgeauth.HeaderEdgeAuth, grant),
			},
		}},
	}, nil
}

// allowUnrouted answers a request that is not on the data path: allowed, nothing added, and
// the data path's own headers removed, so that a caller's x-wb-cluster can never choose a
// route's cluster when ext_authz did not.
func allowUnrouted() *authv3.CheckResponse {
	return &authv3.CheckResponse{
		Status: &rpcstatus.Status{Code: int32(codes.OK)},
		HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{
			HeadersToRemove: []string{edgeauth.HeaderCluster, edgeauth.HeaderEdgeAuth},
		}},
	}
}

func overwrite(name, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: name, Value: value},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// deny answers err as the HTTP API would: its status, its JSON error body (and Retry-After).
func (s *Server) deny(ctx context.Context, err error) *authv3.CheckResponse {
	ae := toAPIError(err)
	if ae.Status >= 500 {
		s.log.ErrorContext(ctx, "ext_authz check failed", "err", err)
	}
	body, _ := json.Marshal(errorBody{Error: *ae}) // strings only: never fails
	headers := []*corev3.HeaderValueOption{overwrite("content-type", "application/json")}
	if ae.RetryAfter > 0 {
		headers = append(headers, overwrite("retry-after", strconv.Itoa(int(max(1, (ae.RetryAfter+time.Second-1)/time.Second)))))
	}
	code := codes.PermissionDenied
	switch {
	case ae.Status == 401:
		code = codes.Unauthenticated
	case ae.Status >= 500:
		code = codes.Unavailable
	}
	return &authv3.CheckResponse{
		Status: &rpcstatus.Status{Code: int32(code), Message: ae.Message},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(ae.Status)},
			Headers: headers,
			Body:    string(append(body, '\n')),
		}},
	}
}

// requestHeader answers a header of the checked request, lower-case name, from the header map
// Envoy sends by default or the raw one it sends with encode_raw_headers.
func requestHeader(h *authv3.AttributeContext_HttpRequest, name string) string {
	if v, ok := h.GetHeaders()[name]; ok {
		return v
	}
	for _, hv := range h.GetHeaderMap().GetHeaders() {
		if strings.EqualFold(hv.GetKey(), name) {
			if raw := hv.GetRawValue(); raw != nil {
				return string(raw)
			}
			return hv.GetValue()
		}
	}
	return ""
}
