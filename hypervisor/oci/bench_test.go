package oci_test

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"wb/hypervisor/templates"
)

// BenchmarkCreateBoot measures create + boot of a busybox guest until its init has written
// its ready file (stop and delete are outside the timer).
func BenchmarkCreateBoot(b *testing.B) {
	cat := catalog(b)
	for _, rt := range runtimes() {
		b.Run(rt, func(b *testing.B) {
			d := newDriver(b, rt)
			ctx := context.Background()
			for b.Loop() {
				b.StopTimer()
				s := guestSpec(b, cat[templates.Base], jobRunner)
				b.StartTimer()
				if err := d.Create(ctx, s); err != nil {
					b.Fatal(err)
				}
				if err := d.Boot(ctx, s.ID); err != nil {
					b.Fatal(err)
				}
				waitFile(b, filepath.Join(s.AgentDir, "ready"), 30*time.Second)
				b.StopTimer()
				if err := d.Stop(ctx, s.ID); err != nil {
					b.Fatal(err)
				}
				if err := d.Delete(ctx, s.ID); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// BenchmarkPauseResume measures one pause + resume round trip of a running guest.
func BenchmarkPauseResume(b *testing.B) {
	cat := catalog(b)
	for _, rt := range runtimes() {
		b.Run(rt, func(b *testing.B) {
			d := newDriver(b, rt)
			ctx := context.Background()
			s := guestSpec(b, cat[templates.Base], jobRunner)
			boot(b, d, s)
			for b.Loop() {
				if err := d.Pause(ctx, s.ID); err != nil {
					b.Fatal(err)
				}
				if err := d.Resume(ctx, s.ID); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCheckpointRestore measures the runsc "live snapshot": a memory snapshot (which
// stops the guest), delete, and a memory restore under the same id.
func BenchmarkCheckpointRestore(b *testing.B) {
	cat := catalog(b)
	d := newDriver(b, "runsc")
	ctx := context.Background()
	s := guestSpec(b, cat[templates.Base], `echo ready > /run/wb/ready; i=0; while :; do i=$((i+1)); echo $i > /workspace/count; sleep 0.1; done`)
	boot(b, d, s)
	dirs := b.TempDir()
	n := 0
	for b.Loop() {
		n++
		snap := filepath.Join(dirs, "snap"+strconv.Itoa(n))
		si, err := d.Snapshot(ctx, s.ID, snap, true)
		if err != nil {
			b.Fatal(err)
		}
		if !si.Memory {
			b.Fatal("no memory snapshot")
		}
		if err := d.Delete(ctx, s.ID); err != nil {
			b.Fatal(err)
		}
		s.Writable = filepath.Join(dirs, "w"+strconv.Itoa(n))
		if err := d.Restore(ctx, s, snap); err != nil {
			b.Fatal(err)
		}
	}
}
