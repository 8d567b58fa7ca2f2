package xds

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/protobuf/proto"
)

func sortByName(r *Resources) {
	slices.SortFunc(r.Listeners, func(a, b *listenerT) int { return strings.Compare(a.GetName(), b.GetName()) })
	slices.SortFunc(r.Routes, func(a, b *routeT) int { return strings.Compare(a.GetName(), b.GetName()) })
	slices.SortFunc(r.Clusters, func(a, b *clusterT) int { return strings.Compare(a.GetName(), b.GetName()) })
	slices.SortFunc(r.Endpoints, func(a, b *endpointT) int { return strings.Compare(a.GetClusterName(), b.GetClusterName()) })
	slices.SortFunc(r.Secrets, func(a, b *secretT) int { return strings.Compare(a.GetName(), b.GetName()) })
}

// validator is what every generated Envoy message offers (protoc-gen-validate).
type validator interface{ ValidateAll() error }

// Snapshot validates the resources (each its ValidateAll, then the snapshot's Consistent)
// and versions each type by a hash of its content, so that a version names the same bytes on
// every replica and across restarts, and a type whose resources did not change keeps its
// version (a node joining changes CDS and EDS only).
func (r *Resources) Snapshot() (*cachev3.Snapshot, error) {
	var errs []error
	snap := &cachev3.Snapshot{}
	add := func(t types.ResponseType, items []types.Resource) {
		h := sha256.New()
		for _, it := range items {
			if v, ok := it.(validator); ok {
				if err := v.ValidateAll(); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", cachev3.GetResourceName(it), err))
				}
			}
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(it)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", cachev3.GetResourceName(it), err))
				continue
			}
			fmt.Fprintf(h, "%d:", len(b))
			h.Write(b)
		}
		snap.Resources[t] = cachev3.NewResources(hex.EncodeToString(h.Sum(nil))[:16], items)
	}
	add(types.Listener, asResources(r.Listeners))
	add(types.Route, asResources(r.Routes))
	add(types.Cluster, asResources(r.Clusters))
	add(types.Endpoint, asResources(r.Endpoints))
	add(types.Secret, asResources(r.Secrets))
	if len(errs) > 0 {
		return nil, fmt.Errorf("invalid resources: %w", errors.Join(errs...))
	}
	if err := snap.Consistent(); err != nil {
		return nil, fmt.Errorf("inconsistent snapshot: %w", err)
	}
	return snap, nil
}

func asResources[T types.Resource](items []T) []types.Resource {
	out := make([]types.Resource, len(items))
	for i, it := range items {
		out[i] = it
	}
	return out
}

// versions is a snapshot's version per type, in a fixed order (for logs and comparisons):
// LDS, RDS, CDS, EDS, SDS.
func versions(s *cachev3.Snapshot) [5]string {
	return [5]string{
		s.Resources[types.Listener].Version, s.Resources[types.Route].Version,
		s.Resources[types.Cluster].Version, s.Resources[types.Endpoint].Version,
		s.Resources[types.Secret].Version,
	}
}
