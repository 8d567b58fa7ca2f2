package chvtest

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"sync"

	"wb/hypervisor"
)

// oomPanicLine is what Linux prints when it panics on an out-of-memory (mm/oom_kill.c,
// check_panic_on_oom, with vm.panic_on_oom=1).
const oomPanicLine = "Kernel panic - not syncing: Out of memory: system-wide panic_on_oom is enabled"

// oomView is what an out-of-memory needs of the VM config.
type oomView struct {
	Payload struct {
		Cmdline string `json:"cmdline"`
	} `json:"payload"`
	Console *struct {
		Mode string `json:"mode"`
		File string `json:"file"`
	} `json:"console"`
	Pvpanic bool `json:"pvpanic"`
}

// oomViewOf reads cfg for watchOOM; the caller holds what guards cfg (the VMM's lock: a
// resize changes the config).
func oomViewOf(cfg *vmConfig) oomView {
	var view oomView
	if b, err := json.Marshal(cfg.raw); err == nil {
		_ = json.Unmarshal(b, &view)
	}
	return view
}

// panicsOnOOM reports whether the command line sets sysctl.vm.panic_on_oom (1 or 2): the
// fake's guest is one memory cgroup, so an OOM in it is the whole VM's.
func panicsOnOOM(cmdline string) bool {
	for _, w := range strings.Fields(cmdline) {
		if w == "--" {
			break
		}
		if k, v, _ := strings.Cut(w, "="); k == "sysctl.vm.panic_on_oom" && (v == "1" || v == "2") {
			return true
		}
	}
	return false
}

// watchOOM makes the guest's first OOM kill what a kernel booted with panic_on_oom makes of
// it (doc.go): the panic line on the console, guest/panic through pvpanic, and a hung VM (the
// guest frozen, the VM left Running). The kernel panics whichever process the kill took, init
// too. Without panic_on_oom an OOM kill stays inside the guest, as in a VM: the kernel kills a
// process and the host sees nothing.
func (v *VMM) watchOOM(vm *vmInstance, view oomView) {
	settled := sync.OnceFunc(func() { close(vm.oomSettled) })
	defer settled()
	if !panicsOnOOM(view.Payload.Cmdline) {
		return
	}
	ctx := context.Background() // the channel closes when the guest is gone
	ch, err := vm.guest.drv.Events(ctx, vm.guest.id)
	if err != nil {
		v.log.Warn("watch the guest for OOM kills", "err", err)
		return
	}
	for ev := range ch {
		if ev.Type != hypervisor.EventOOM {
			continue
		}
		v.mu.Lock()
		if v.vm == vm {
			v.oomPanic(vm, view)
		}
		v.mu.Unlock()
		settled()
		for range ch { // the guest's end
		}
		return
	}
}

// oomPanic is the kernel's panic on an OOM kill; the caller holds the VMM's lock.
func (v *VMM) oomPanic(vm *vmInstance, view oomView) {
	v.log.Info("guest out of memory: kernel panic (panic_on_oom)")
	vm.oomPanicked = true
	if vm.console != nil {
		vm.console.write([]byte(oomPanicLine + "\n"))
	} else if view.Console != nil && view.Console.Mode == "File" && view.Console.File != "" {
		if f, err := os.OpenFile(view.Console.File, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600); err == nil {
			_, _ = f.WriteString(oomPanicLine + "\n")
			_ = f.Close()
		}
	}
	select {
	case <-vm.guest.exited: // the kill took init: nothing left to freeze
	default:
		if err := vm.guest.drv.Pause(context.Background(), vm.guest.id); err != nil {
			v.log.Warn("freeze the panicked guest", "err", err)
		}
	}
	if view.Pvpanic {
		v.events.emit("guest", "panic", map[string]string{"event": "panic"})
	}
}
