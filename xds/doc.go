// Package xds has no code yet. It is to hold the control plane of an Envoy fleet: Envoy's
// resources (listeners, routes, one cluster per node and never one per session, so that
// session churn causes no xDS traffic), validated before they are published, served with
// go-control-plane, and tested with grpc-go's xDS client as the consumer. Until then `wb serve`
// reaches guests through the gateway's own exec and PTY proxy.
package xds
