package oci_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"wb/hypervisor/oci"
	"wb/hypervisor/templates"
)

// BenchmarkCreateBoot measures create + boot of a busybox guest until its init has written
// its ready file (stop and delete are outside the timer). Beside each runtime, in the same
// run, its baseline bare-RUNTIME: the runtime alone running `sh -c true` on the same root
// file system to its exit.
func BenchmarkCreateBoot(b *testing.B) {
	cat := catalog(b)
	for _, rt := range runtimes() {
		b.Run("bare-"+rt, func(b *testing.B) { bareRun(b, rt, cat[templates.Base].RootFS) })
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

// bareRun times `RUNTIME run` of the runtime's own default spec (`runc spec`: its
// namespaces, no cgroup limits, no agent, no writable layer, no binds) with the template's
// root file system read-only and `/bin/sh -c true`, to the process's exit; the runtime
// deletes the container on exit. runsc gets the driver's default global flags.
func bareRun(b *testing.B, rt, rootfs string) {
	if _, err := exec.LookPath(rt); err != nil {
		b.Fatalf("%s is not installed: %v", rt, err)
	}
	bundle, state := b.TempDir(), b.TempDir()
	if out, err := exec.Command("runc", "spec", "--bundle", bundle).CombinedOutput(); err != nil {
		b.Fatalf("runc spec: %v: %s", err, out)
	}
	cfgPath := filepath.Join(bundle, "config.json")
	raw, err := os.ReadFile(cfgPath)
	if err != nil {
		b.Fatal(err)
	}
	var cfg specs.Spec
	if err := json.Unmarshal(raw, &cfg); err != nil {
		b.Fatalf("runc spec's config.json: %v", err)
	}
	cfg.Root = &specs.Root{Path: rootfs, Readonly: true}
	cfg.Process.Terminal = false
	cfg.Process.Args = []string{"/bin/sh", "-c", "true"}
	if raw, err = json.Marshal(&cfg); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, raw, 0o600); err != nil {
		b.Fatal(err)
	}
	global := []string{"--root", state}
	if rt == oci.RuntimeRunsc {
		global = append(global, oci.DefaultRunscFlags()...)
	}
	ctx := b.Context()
	n := 0
	for b.Loop() {
		n++
		args := append(append([]string(nil), global...), "run", "--bundle", bundle, "bare"+strconv.Itoa(n))
		if out, err := exec.CommandContext(ctx, rt, args...).CombinedOutput(); err != nil {
			b.Fatalf("%s run: %v: %s", rt, err, out)
		}
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
