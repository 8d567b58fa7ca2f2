package cloudhv_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"wb/hypervisor/cloudhv/chapi"
)

// BenchmarkCalls measures the driver's lifecycle calls on one booted guest of the fake VMM
// beside the bare API calls they make (chapi straight on the socket), in the same run: the
// difference is the driver's own overhead (its record, the process check, the error paths).
func BenchmarkCalls(b *testing.B) {
	e := newEnv(b)
	ctx := testCtx(b, 10*time.Minute)
	s := e.spec(newID())
	e.boot(b, ctx, s)
	bare := chapi.New(filepath.Join(e.d.GuestDir(s.ID), "api.sock"))
	run := func(name string, f func() error) {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if err := f(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	run("driver/Info", func() error { _, err := e.d.Info(ctx, s.ID); return err })
	run("bare/vm.info", func() error { _, err := bare.VMInfo(ctx); return err })
	run("driver/PauseResume", func() error {
		if err := e.d.Pause(ctx, s.ID); err != nil {
			return err
		}
		return e.d.Resume(ctx, s.ID)
	})
	run("bare/vm.pause+vm.resume", func() error {
		if err := bare.PauseVM(ctx); err != nil {
			return err
		}
		return bare.ResumeVM(ctx)
	})
	run("driver/Stats", func() error { _, err := e.d.Stats(ctx, s.ID); return err })
	run("driver/DialAgent", func() error {
		c, err := e.d.DialAgent(ctx, s.ID)
		if err == nil {
			c.Close()
		}
		return err
	})
	run("bare/vmm.ping", func() error { _, err := bare.Ping(context.Background()); return err })
}
