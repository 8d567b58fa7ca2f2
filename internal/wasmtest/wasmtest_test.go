package wasmtest_test

import (
	"context"
	"testing"
	"time"

	"wb/internal/wasmtest"
	"wb/plugins"
)

// The module passes the host's validation and answers its result.
func TestConstPlugin(t *testing.T) {
	ctx := context.Background()
	host, err := plugins.NewHost(ctx, nil, plugins.Options{CacheDir: t.TempDir(), Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = host.Close(ctx) })
	d, _, err := host.Call(ctx, wasmtest.ConstPlugin(`{"allow":false,"reasons":["no"],"patch":{"tier":1}}`), []byte(`{"point":"admission"}`))
	if err != nil {
		t.Fatal(err)
	}
	if d.Allow || len(d.Reasons) != 1 || d.Reasons[0] != "no" || d.Patch["tier"] != 1.0 {
		t.Fatalf("%+v", d)
	}
}
