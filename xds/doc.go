// Package xds builds Envoy's resources (one cluster per node, never per session) and serves
// them with go-control-plane; grpc-go's xDS client is its consumer in tests.
package xds
