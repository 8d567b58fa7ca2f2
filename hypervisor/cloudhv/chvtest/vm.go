package chvtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// VM states, named as CH's VmState serializes them.
const (
	stateCreated  = "Created"
	stateRunning  = "Running"
	statePaused   = "Paused"
	stateShutdown = "Shutdown"
)

// CH's defaults for a config that leaves them out (vmm/src/config.rs).
const (
	defaultVCPUs  = 1
	defaultMemory = 512 << 20
)

func jsonMarshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}

// vmConfig is the VmConfig as the client sent it (kept whole, so that vm.info and a snapshot
// give back every field) plus typed access to the parts the fake acts on.
type vmConfig struct {
	raw map[string]any
}

type diskConfig struct {
	ID       string `json:"id,omitempty"`
	Path     string `json:"path,omitempty"`
	Readonly bool   `json:"readonly,omitempty"`
}

type netConfig struct {
	ID  string `json:"id,omitempty"`
	Tap string `json:"tap,omitempty"`
	Mac string `json:"mac,omitempty"`
}

type vsockConfig struct {
	ID     string `json:"id,omitempty"`
	CID    int64  `json:"cid"`
	Socket string `json:"socket"`
}

type vmConfigView struct {
	Payload *struct {
		Kernel   string `json:"kernel,omitempty"`
		Firmware string `json:"firmware,omitempty"`
		Cmdline  string `json:"cmdline,omitempty"`
	} `json:"payload"`
	Cpus *struct {
		BootVcpus int `json:"boot_vcpus"`
		MaxVcpus  int `json:"max_vcpus"`
	} `json:"cpus"`
	Memory *struct {
		Size        int64 `json:"size"`
		HotplugSize int64 `json:"hotplug_size"`
	} `json:"memory"`
	Disks   []diskConfig `json:"disks"`
	Net     []netConfig  `json:"net"`
	Vsock   *vsockConfig `json:"vsock"`
	Pvpanic bool         `json:"pvpanic"`
}

// decodeStrict decodes one JSON value into v, as serde does: trailing data is an error.
func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing characters")
	}
	return nil
}

func parseConfig(b []byte) (*vmConfig, error) {
	var raw map[string]any
	if err := decodeStrict(b, &raw); err != nil {
		return nil, err
	}
	if raw == nil {
		return nil, errors.New("invalid type: null, expected struct VmConfig")
	}
	c := &vmConfig{raw: raw}
	view, err := c.view()
	if err != nil {
		return nil, err
	}
	if view.Payload == nil {
		return nil, errors.New("missing field `payload`")
	}
	// CH fills in the defaults of what was left out.
	if view.Cpus == nil {
		raw["cpus"] = map[string]any{"boot_vcpus": defaultVCPUs, "max_vcpus": defaultVCPUs}
	}
	if view.Memory == nil {
		raw["memory"] = map[string]any{"size": defaultMemory}
	}
	return c, nil
}

func (c *vmConfig) view() (vmConfigView, error) {
	var v vmConfigView
	b, err := json.Marshal(c.raw)
	if err == nil {
		err = json.Unmarshal(b, &v)
	}
	return v, err
}

func (c *vmConfig) clone() *vmConfig {
	b, _ := json.Marshal(c.raw)
	var raw map[string]any
	_ = decodeStrict(b, &raw)
	return &vmConfig{raw: raw}
}

func (c *vmConfig) set(section, key string, val any) {
	m, _ := c.raw[section].(map[string]any)
	if m == nil {
		m = map[string]any{}
		c.raw[section] = m
	}
	m[key] = val
}

// validate is the part of CH's VmConfig::validate the fake enforces: device ids unique,
// vCPU counts sane, a payload to boot.
func (c *vmConfig) validate() *apiError {
	v, err := c.view()
	if err != nil {
		return &apiError{status: http.StatusBadRequest, chain: []string{"Failed to validate config", err.Error()}}
	}
	if v.Payload == nil || v.Payload.Kernel == "" && v.Payload.Firmware == "" {
		return &apiError{status: http.StatusBadRequest, chain: []string{"Failed to validate config", "Error validating payload", "No kernel or firmware payload provided"}}
	}
	if v.Cpus != nil && (v.Cpus.BootVcpus < 1 || v.Cpus.MaxVcpus < v.Cpus.BootVcpus) {
		return &apiError{status: http.StatusBadRequest, chain: []string{"Failed to validate config", "Max is less than boot"}}
	}
	seen := map[string]bool{}
	var ids []string
	for _, d := range v.Disks {
		ids = append(ids, d.ID)
	}
	for _, n := range v.Net {
		ids = append(ids, n.ID)
	}
	if v.Vsock != nil {
		ids = append(ids, v.Vsock.ID)
	}
	for _, id := range ids {
		if id == "" {
			continue
		}
		if seen[id] {
			return &apiError{status: http.StatusConflict, chain: []string{"Failed to validate config", fmt.Sprintf("Identifier %s is not unique", id)}}
		}
		seen[id] = true
	}
	return nil
}

// vmInstance is a booted VM (CH's VmOwnership::Owned).
type vmInstance struct {
	state string
	// The guest's memory (bytes): at boot, now, and the end of its hotplug range.
	bootRAM, ram, ramTop int64
	devices              int // CH's device name counter (_disk0, _net1, ...), continued by hot-plugs
	guest                *guest
	vsock                *hybridVsock
	nets                 map[string]*netLink // by device id: the net devices joined to the guest
	console              *ptyConsole         // the virtio console in Pty mode (else nil)
	debugPort            *debugPort          // the I/O port 0x80 (debugport.go)
	// oomSettled closes once watchOOM has made the first OOM kill a panic, or knows there
	// will be none; oomPanicked (under the VMM's lock) says which.
	oomSettled  chan struct{}
	oomPanicked bool
	mu          sync.Mutex // guards state for the vsock gate
	changed     chan struct{}
	gone        bool
}

func newInstance(g *guest) *vmInstance {
	return &vmInstance{guest: g, changed: make(chan struct{}), oomSettled: make(chan struct{})}
}

func (vm *vmInstance) setState(s string) {
	vm.mu.Lock()
	vm.state = s
	close(vm.changed)
	vm.changed = make(chan struct{})
	vm.mu.Unlock()
}

// waitRunning is the vsock gate: a paused VM's devices answer nothing until it resumes.
func (vm *vmInstance) waitRunning(ctx context.Context) bool {
	for {
		vm.mu.Lock()
		st, gone, ch := vm.state, vm.gone, vm.changed
		vm.mu.Unlock()
		if gone {
			return false
		}
		if st == stateRunning {
			return true
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

func (vm *vmInstance) teardown(ctx context.Context) {
	vm.mu.Lock()
	vm.gone = true
	close(vm.changed)
	vm.changed = make(chan struct{})
	vm.mu.Unlock()
	if vm.vsock != nil {
		vm.vsock.close()
	}
	for _, l := range vm.nets {
		l.close()
	}
	if vm.console != nil {
		vm.console.close()
	}
	if vm.debugPort != nil {
		vm.debugPort.close()
	}
	vm.guest.cleanup(ctx)
}

func deserializeError(err error) apiResponse {
	return errorChain(http.StatusBadRequest, "Failed to deserialize JSON", err.Error())
}

func notCreated(action string) *apiError {
	return &apiError{status: http.StatusNotFound, chain: []string{action, "VM is not created"}}
}

func notRunning(action string) *apiError {
	return &apiError{status: http.StatusInternalServerError, chain: []string{action, "VM is not running"}}
}

func alreadyCreated(action string) *apiError {
	return &apiError{status: http.StatusInternalServerError, chain: []string{action, "VM is already created"}}
}

func internal(action string, err error) *apiError {
	return &apiError{status: http.StatusInternalServerError, chain: []string{action, err.Error()}}
}

func (v *VMM) apiPing(_ context.Context, _ []byte) apiResponse {
	b, _ := jsonMarshal(map[string]any{"build_version": "chvtest", "version": "v54.0-chvtest", "pid": os.Getpid(), "features": []string{"kvm"}})
	return apiResponse{status: http.StatusOK, body: b}
}

func (v *VMM) apiCreate(_ context.Context, body []byte) apiResponse {
	cfg, err := parseConfig(body)
	if err != nil {
		return deserializeError(err)
	}
	if v.cfg != nil {
		return alreadyCreated("The VM could not be created").response()
	}
	v.cfg = cfg
	return noContent()
}

const actBoot = "The VM could not boot"

func (v *VMM) apiBoot(ctx context.Context, _ []byte) apiResponse {
	if v.vm != nil {
		return alreadyCreated(actBoot).response()
	}
	v.events.emit("vm", "booting", nil)
	if v.cfg == nil {
		return (&apiError{status: http.StatusNotFound, chain: []string{actBoot, "VM config is missing"}}).response()
	}
	vm, aerr := v.startVM(ctx, v.cfg, true)
	if aerr != nil {
		aerr.chain = append([]string{actBoot}, aerr.chain...)
		return aerr.response()
	}
	v.vm = vm
	v.events.emit("vm", "booted", nil)
	return noContent()
}

// startVM validates cfg, names its unnamed devices as CH does, mounts the disks, creates the
// guest and binds the vsock socket; with boot it starts init (else the guest stays created,
// a restored VM's "paused").
func (v *VMM) startVM(ctx context.Context, cfg *vmConfig, boot bool) (*vmInstance, *apiError) {
	if aerr := cfg.validate(); aerr != nil {
		return nil, aerr
	}
	view, _ := cfg.view()
	devices := 0
	v.nameDevices(cfg, view, &devices)
	view, _ = cfg.view()
	gc, err := guestConfigOf(view)
	if err != nil {
		return nil, &apiError{status: http.StatusInternalServerError, chain: []string{err.Error()}}
	}
	bootCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
	defer cancel()
	g, err := v.createGuest(bootCtx, gc)
	if err != nil {
		return nil, &apiError{status: http.StatusInternalServerError, chain: []string{"Error from the fake's guest", err.Error()}}
	}
	vm := newInstance(g)
	vm.state = statePaused
	if vm.debugPort, err = openDebugPort(g.runDir(), v.log, v.events.start); err != nil {
		vm.teardown(bootCtx)
		return nil, &apiError{status: http.StatusInternalServerError, chain: []string{err.Error()}}
	}
	// As CH's pre_create_console_devices, at boot and at restore: a Pty console gets a new
	// pseudo-terminal, named in the config (vm.info) in place of whatever console.file said.
	if con, ok := cfg.raw["console"].(map[string]any); ok && con["mode"] == "Pty" {
		if vm.console, err = openPtyConsole(); err != nil {
			vm.teardown(bootCtx)
			return nil, &apiError{status: http.StatusInternalServerError, chain: []string{err.Error()}}
		}
		con["file"] = vm.console.sub.Name()
	}
	if view.Memory != nil {
		vm.bootRAM, vm.ram, vm.ramTop = view.Memory.Size, view.Memory.Size, view.Memory.Size+view.Memory.HotplugSize
	}
	vm.devices = devices
	if len(view.Net) > 0 && v.opts.JoinTaps {
		ip, hasIP := parseIPParam(view.Payload.Cmdline)
		links, err := linkNets(bootCtx, g, view.Net, ip, hasIP)
		if err != nil {
			vm.teardown(bootCtx)
			return nil, &apiError{status: http.StatusInternalServerError, chain: []string{"Error creating virtio-net device", err.Error()}}
		}
		vm.nets = map[string]*netLink{}
		for _, l := range links {
			vm.nets[l.id] = l
		}
	}
	if view.Vsock != nil {
		vm.vsock, err = listenVsock(view.Vsock.Socket, g.vsockDir(), vm.waitRunning, v.log)
		if err != nil {
			vm.teardown(bootCtx)
			return nil, &apiError{status: http.StatusInternalServerError, chain: []string{"Error creating virtio-vsock device", err.Error()}}
		}
	}
	if boot {
		if err := g.start(bootCtx); err != nil {
			vm.teardown(bootCtx)
			return nil, &apiError{status: http.StatusInternalServerError, chain: []string{"Error from the fake's guest", err.Error()}}
		}
		vm.setState(stateRunning)
	}
	go v.watchGuest(vm)
	go v.watchOOM(vm, oomViewOf(cfg))
	return vm, nil
}

// nameDevices gives every device without an id CH's generated name (_disk0, _net1, ...,
// one counter for all, in creation order).
func (v *VMM) nameDevices(cfg *vmConfig, view vmConfigView, counter *int) {
	used := map[string]bool{}
	for _, d := range view.Disks {
		used[d.ID] = true
	}
	for _, d := range view.Net {
		used[d.ID] = true
	}
	if view.Vsock != nil {
		used[view.Vsock.ID] = true
	}
	next := func(prefix string) string {
		for {
			name := fmt.Sprintf("%s%d", prefix, *counter)
			*counter++
			if !used[name] {
				used[name] = true
				return name
			}
		}
	}
	if disks, ok := cfg.raw["disks"].([]any); ok {
		for _, d := range disks {
			if m, ok := d.(map[string]any); ok && (m["id"] == nil || m["id"] == "") {
				m["id"] = next("_disk")
			}
		}
	}
	if nets, ok := cfg.raw["net"].([]any); ok {
		for _, d := range nets {
			if m, ok := d.(map[string]any); ok && (m["id"] == nil || m["id"] == "") {
				m["id"] = next("_net")
			}
		}
	}
	if m, ok := cfg.raw["vsock"].(map[string]any); ok && (m["id"] == nil || m["id"] == "") {
		m["id"] = next("_vsock")
	}
}

// guestConfigOf maps the VM config onto the runc guest (the contract in doc.go).
func guestConfigOf(view vmConfigView) (guestConfig, error) {
	var gc guestConfig
	if view.Payload.Kernel != "" {
		if fi, err := os.Stat(view.Payload.Kernel); err != nil || !fi.Mode().IsRegular() {
			return gc, fmt.Errorf("Error loading kernel: payload.kernel %q is not a readable file", view.Payload.Kernel)
		}
	}
	var root, writable *diskConfig
	for i := range view.Disks {
		switch view.Disks[i].ID {
		case "rootfs":
			root = &view.Disks[i]
		case "writable":
			writable = &view.Disks[i]
		}
	}
	if root == nil && len(view.Disks) > 0 {
		root = &view.Disks[0]
	}
	if writable == nil && len(view.Disks) > 1 && &view.Disks[1] != root {
		writable = &view.Disks[1]
	}
	if root == nil || writable == nil {
		return gc, errors.New(`the fake boots from two disks: id "rootfs" (the root image) and id "writable" (the writable layer image)`)
	}
	gc.RootImage, gc.WritableImage, gc.WritableReadOnly = root.Path, writable.Path, writable.Readonly
	gc.Init = parseCmdline(view.Payload.Cmdline)
	if view.Cpus != nil {
		gc.VCPU = view.Cpus.BootVcpus
	}
	if view.Memory != nil {
		gc.MemoryMiB = int(view.Memory.Size >> 20)
	}
	return gc, nil
}

// watchGuest turns the end of init into what CH sees of a guest (doc.go): status 0 is a
// power-off (CH shuts the VMM down), anything else a kernel panic ("Attempted to kill init"),
// reported through pvpanic when the VM has that device; the VM then hangs, Running. An init
// killed by an OOM that panicked the kernel first is that panic, and no second one.
func (v *VMM) watchGuest(vm *vmInstance) {
	<-vm.guest.exited
	<-vm.oomSettled // the driver's events report an OOM kill before the exit it caused
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.vm != vm {
		return // shut down through the API
	}
	status := vm.guest.status
	v.log.Info("guest init exited", "status", status)
	if vm.oomPanicked {
		return // the kernel hung at the OOM's panic
	}
	if status == 0 {
		if err := v.vmmShutdown(context.Background()); err != nil {
			v.log.Error("shutdown after guest power-off", "err", err)
		}
		return
	}
	if view, err := v.cfg.view(); err == nil && view.Pvpanic {
		v.events.emit("guest", "panic", map[string]string{"event": "panic"})
	}
}

const (
	actPause  = "The VM could not be paused"
	actResume = "The VM could not resume"
)

func transitionError(action, wrap, migratable string, from, to string) *apiError {
	return &apiError{status: http.StatusInternalServerError, chain: []string{action, wrap, migratable,
		fmt.Sprintf("Invalid transition: InvalidStateTransition(%s, %s)", from, to)}}
}

func (v *VMM) apiPause(ctx context.Context, _ []byte) apiResponse {
	if v.vm == nil {
		return notRunning(actPause).response()
	}
	v.events.emit("vm", "pausing", nil)
	if v.vm.state != stateRunning {
		return transitionError(actPause, "Cannot pause VM", "Failed to pause migratable component", v.vm.state, statePaused).response()
	}
	if err := v.vm.guest.drv.Pause(ctx, v.vm.guest.id); err != nil {
		return internal(actPause, err).response()
	}
	v.vm.setState(statePaused)
	v.events.emit("vm", "paused", nil)
	return noContent()
}

func (v *VMM) apiResume(ctx context.Context, _ []byte) apiResponse {
	if v.vm == nil {
		return notRunning(actResume).response()
	}
	if aerr := v.resume(ctx); aerr != nil {
		return aerr.response()
	}
	return noContent()
}

func (v *VMM) resume(ctx context.Context) *apiError {
	v.events.emit("vm", "resuming", nil)
	if v.vm.state != statePaused {
		return transitionError(actResume, "Cannot resume VM", "Failed to resume migratable component", v.vm.state, stateRunning)
	}
	g := v.vm.guest
	var err error
	if g.started {
		err = g.drv.Resume(ctx, g.id)
	} else {
		err = g.start(ctx) // a restored VM: its init runs now (see doc.go)
	}
	if err != nil {
		return internal(actResume, err)
	}
	v.vm.setState(stateRunning)
	v.events.emit("vm", "resumed", nil)
	return nil
}

const actShutdown = "The VM could not shutdown"

func (v *VMM) apiShutdown(ctx context.Context, _ []byte) apiResponse {
	if err := v.vmShutdown(ctx); err != nil {
		return err.response()
	}
	return noContent()
}

// vmShutdown is CH's vm_shutdown: the VM is dropped (guest killed, disks unmounted, vsock
// socket removed); its config stays, so vm.info says Created and vm.boot boots it again.
func (v *VMM) vmShutdown(ctx context.Context) *apiError {
	if v.vm == nil {
		return notRunning(actShutdown)
	}
	v.vm.teardown(ctx)
	v.vm = nil
	v.events.emit("vm", "shutdown", nil)
	return nil
}

func (v *VMM) apiDelete(ctx context.Context, _ []byte) apiResponse {
	if err := v.vmDelete(ctx, "The VM could not be deleted"); err != nil {
		return err.response()
	}
	return noContent()
}

func (v *VMM) vmDelete(ctx context.Context, action string) *apiError {
	if v.cfg == nil {
		return nil
	}
	if v.vm != nil {
		if err := v.vmShutdown(ctx); err != nil {
			err.chain[0] = action
			return err
		}
	}
	v.cfg = nil
	v.events.emit("vm", "deleted", nil)
	return nil
}

func (v *VMM) apiVmmShutdown(ctx context.Context, _ []byte) apiResponse {
	if err := v.vmmShutdown(ctx); err != nil {
		return err.response()
	}
	return apiResponse{status: http.StatusOK}
}

// vmmShutdown is CH's vmm_shutdown: delete the VM, then the process ends (Serve returns once
// the answer is out).
func (v *VMM) vmmShutdown(ctx context.Context) *apiError {
	if err := v.vmDelete(ctx, "The VMM could not shutdown"); err != nil {
		return err
	}
	v.events.emit("vmm", "shutdown", nil)
	v.exitVMM()
	return nil
}

func (v *VMM) apiInfo(_ context.Context, _ []byte) apiResponse {
	if v.cfg == nil {
		return notCreated("The VM info is not available").response()
	}
	state := stateCreated
	if v.vm != nil {
		state = v.vm.state
	}
	view, _ := v.cfg.view()
	info := map[string]any{"config": v.cfg.raw, "state": state}
	if view.Memory != nil {
		info["memory_actual_size"] = view.Memory.Size
	}
	b, err := jsonMarshal(info)
	if err != nil {
		return internal("The VM info is not available", err).response()
	}
	return apiResponse{status: http.StatusOK, body: b}
}

func (v *VMM) apiCounters(_ context.Context, _ []byte) apiResponse {
	if v.vm == nil {
		return notRunning("The VM info is not available").response()
	}
	view, _ := v.cfg.view()
	out := map[string]map[string]uint64{}
	for _, d := range view.Disks {
		dir := v.vm.guest.rootfsDir()
		if d.ID == "writable" || d.Path == v.diskPath(view, "writable") {
			dir = v.vm.guest.writableDir()
		}
		out[d.ID] = diskCounters(dir)
	}
	for _, n := range view.Net {
		// A device not joined to the guest (doc.go) counts nothing.
		out[n.ID] = map[string]uint64{"rx_bytes": 0, "rx_frames": 0, "tx_bytes": 0, "tx_frames": 0}
		if l, ok := v.vm.nets[n.ID]; ok {
			out[n.ID] = l.counters()
		}
	}
	b, _ := jsonMarshal(out)
	return apiResponse{status: http.StatusOK, body: b}
}

func (v *VMM) diskPath(view vmConfigView, id string) string {
	gc, err := guestConfigOf(view)
	if err != nil {
		return ""
	}
	if id == "writable" {
		return gc.WritableImage
	}
	return gc.RootImage
}

const actResize = "The VM could not be resized"

func (v *VMM) apiResize(ctx context.Context, body []byte) apiResponse {
	var req struct {
		DesiredVcpus   *int   `json:"desired_vcpus"`
		DesiredRAM     *int64 `json:"desired_ram"`
		DesiredBalloon *int64 `json:"desired_balloon"`
	}
	if err := decodeStrict(body, &req); err != nil {
		return deserializeError(err)
	}
	if v.cfg == nil {
		return notCreated(actResize).response()
	}
	view, _ := v.cfg.view()
	if req.DesiredVcpus != nil && view.Cpus != nil && (*req.DesiredVcpus > view.Cpus.MaxVcpus || *req.DesiredVcpus < 1) {
		if v.vm != nil {
			v.events.emit("vm", "resizing", nil)
		}
		return (&apiError{status: http.StatusInternalServerError, chain: []string{actResize, "Error from CPU manager",
			fmt.Sprintf("Desired vCPUs %d out of range 1..=%d (max_vcpus)", *req.DesiredVcpus, view.Cpus.MaxVcpus)}}).response()
	}
	if v.vm != nil {
		v.events.emit("vm", "resizing", nil)
		vcpus, mem := 0, int64(0)
		if req.DesiredVcpus != nil {
			vcpus = *req.DesiredVcpus
		}
		if req.DesiredRAM != nil {
			var aerr *apiError
			if mem, aerr = v.vm.hotplugRAM(*req.DesiredRAM); aerr != nil {
				return aerr.response()
			}
		}
		if err := v.vm.guest.resize(ctx, vcpus, mem); err != nil {
			return internal(actResize, err).response()
		}
	}
	if req.DesiredVcpus != nil {
		v.cfg.set("cpus", "boot_vcpus", *req.DesiredVcpus)
	}
	if req.DesiredRAM != nil {
		v.cfg.set("memory", "size", *req.DesiredRAM)
	}
	if v.vm != nil {
		v.events.emit("vm", "resized", nil)
	}
	return noContent()
}

// hotplugRAM is what CH's ACPI memory hotplug (memory_manager.rs resize) makes of
// desired_ram on a booted VM: the guest's new memory, or 0 when it keeps what it has. A
// shrink changes nothing (only a balloon takes memory back), nor does a VM booted without
// hotplug_size; growth is one DIMM of a multiple of 128 MiB that must fit in the hotplug
// range (boot size + hotplug_size). vm.resize updates the config's memory.size either way.
func (vm *vmInstance) hotplugRAM(desired int64) (int64, *apiError) {
	if desired <= vm.ram || vm.ramTop == vm.bootRAM {
		return 0, nil
	}
	fail := func(msg string) *apiError {
		return &apiError{status: http.StatusInternalServerError, chain: []string{actResize, "Memory manager error", msg}}
	}
	if (desired-vm.ram)%(128<<20) != 0 {
		return 0, fail("The requested hotplug memory addition is not a valid size")
	}
	if desired > vm.ramTop {
		return 0, fail("Not enough space in the hotplug RAM region")
	}
	vm.ram = desired
	return desired, nil
}

// pciInfo is CH's PciDeviceInfo for a hot-plugged device.
func pciInfo(id string, slot int) []byte {
	b, _ := jsonMarshal(map[string]string{"id": id, "bdf": fmt.Sprintf("0000:00:%02x.0", slot)})
	return b
}

func (v *VMM) nextSlot(view vmConfigView) int {
	return 1 + len(view.Disks) + len(view.Net) + 1 // after the root port, the disks, nets, and vsock
}

func (v *VMM) apiAddVsock(ctx context.Context, body []byte) apiResponse {
	const act = "The vsock device could not be added to the VM"
	var vs map[string]any
	if err := decodeStrict(body, &vs); err != nil {
		return deserializeError(err)
	}
	if v.cfg == nil {
		return notCreated(act).response()
	}
	if _, ok := v.cfg.raw["vsock"]; ok && v.cfg.raw["vsock"] != nil {
		return (&apiError{status: http.StatusInternalServerError, chain: []string{act, "Too many virtio-vsock devices"}}).response()
	}
	trial := v.cfg.clone()
	trial.raw["vsock"] = vs
	if aerr := trial.validate(); aerr != nil {
		aerr.chain = append([]string{act}, aerr.chain...)
		return aerr.response()
	}
	if v.vm == nil {
		v.cfg.raw["vsock"] = vs
		return noContent()
	}
	view, _ := trial.view()
	sock, err := listenVsock(view.Vsock.Socket, v.vm.guest.vsockDir(), v.vm.waitRunning, v.log)
	if err != nil {
		return internal(act, err).response()
	}
	v.vm.vsock = sock
	v.nameDevices(trial, view, &v.vm.devices)
	v.cfg = trial
	view, _ = trial.view()
	return apiResponse{status: http.StatusOK, body: pciInfo(view.Vsock.ID, v.nextSlot(view))}
}

func (v *VMM) apiAddNet(ctx context.Context, body []byte) apiResponse {
	const act = "The network device could not be added to the VM"
	var n map[string]any
	if err := decodeStrict(body, &n); err != nil {
		return deserializeError(err)
	}
	if v.cfg == nil {
		return notCreated(act).response()
	}
	trial := v.cfg.clone()
	nets, _ := trial.raw["net"].([]any)
	trial.raw["net"] = append(nets, n)
	if aerr := trial.validate(); aerr != nil {
		aerr.chain = append([]string{act}, aerr.chain...)
		return aerr.response()
	}
	v.cfg = trial
	if v.vm == nil {
		return noContent()
	}
	view, _ := trial.view()
	v.nameDevices(trial, view, &v.vm.devices)
	view, _ = trial.view()
	id := view.Net[len(view.Net)-1].ID
	return apiResponse{status: http.StatusOK, body: pciInfo(id, v.nextSlot(view))}
}

// Snapshot file names, as CH's (vmm/src/migration, memory_manager.rs).
const (
	snapshotConfigFile = "config.json"
	snapshotStateFile  = "state.json"
	snapshotMemoryFile = "memory-ranges"
)

// fakeMemory is what the fake writes in place of the guest's memory (see doc.go).
type fakeMemory struct {
	Fake    string   `json:"fake"`
	Note    string   `json:"note"`
	Init    string   `json:"init"`
	Args    []string `json:"args"`
	Env     []string `json:"env"`
	GuestID string   `json:"guest_id"`
	TakenAt string   `json:"taken_at"`
}

func urlToPath(url string) (string, error) {
	p, ok := strings.CutPrefix(url, "file://")
	if !ok {
		return "", fmt.Errorf("Could not extract path from URL: %s", url)
	}
	if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("Destination is not a directory: %q", p)
	}
	return p, nil
}

func (v *VMM) apiSnapshot(_ context.Context, body []byte) apiResponse {
	const act = "The VM could not be snapshotted"
	var req struct {
		DestinationURL string `json:"destination_url"`
	}
	if err := decodeStrict(body, &req); err != nil {
		return deserializeError(err)
	}
	if v.vm == nil {
		return notRunning(act).response()
	}
	v.events.emit("vm", "snapshotting", nil)
	if v.vm.state != statePaused {
		return (&apiError{status: http.StatusInternalServerError, chain: []string{act, "Cannot snapshot VM",
			"Failed to snapshot migratable component", "Trying to snapshot while VM is running"}}).response()
	}
	sendErr := func(err error) apiResponse {
		return (&apiError{status: http.StatusInternalServerError, chain: []string{act, "Cannot send VM snapshot",
			"Failed to send migratable component snapshot", err.Error()}}).response()
	}
	dir, err := urlToPath(req.DestinationURL)
	if err != nil {
		return sendErr(err)
	}
	cfgJSON, _ := json.Marshal(v.cfg.raw)
	g := v.vm.guest
	state, _ := json.Marshal(map[string]any{"snapshots": map[string]any{}, "snapshot_data": map[string]any{
		"chvtest": map[string]any{"state": statePaused, "guest_id": g.id}}})
	mem, _ := json.MarshalIndent(fakeMemory{Fake: "chvtest",
		Note: "a runc guest's memory cannot be saved: a restore boots init afresh from the disks",
		Init: g.spec.Args[0], Args: g.spec.Args[1:], Env: g.spec.Env, GuestID: g.id,
		TakenAt: time.Now().UTC().Format(time.RFC3339Nano)}, "", "  ")
	for _, f := range []struct {
		name string
		data []byte
	}{{snapshotConfigFile, cfgJSON}, {snapshotStateFile, state}, {snapshotMemoryFile, mem}} {
		fh, err := os.OpenFile(filepath.Join(dir, f.name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return sendErr(fmt.Errorf("Error creating VM %s snapshot file: %w", f.name, err))
		}
		_, err = fh.Write(f.data)
		if cerr := fh.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return sendErr(fmt.Errorf("Error writing VM %s snapshot: %w", f.name, err))
		}
	}
	v.events.emit("vm", "snapshotted", nil)
	return noContent()
}

func (v *VMM) apiRestore(ctx context.Context, body []byte) apiResponse {
	const act = "The VM could not be restored"
	var req struct {
		SourceURL string `json:"source_url"`
		Prefault  bool   `json:"prefault"`
		Resume    bool   `json:"resume"`
	}
	if err := decodeStrict(body, &req); err != nil {
		return deserializeError(err)
	}
	if v.vm != nil || v.cfg != nil {
		return alreadyCreated(act).response()
	}
	recvErr := func(err error) apiResponse {
		return (&apiError{status: http.StatusInternalServerError, chain: []string{act, "Cannot restore VM",
			"Failed to receive migratable component", err.Error()}}).response()
	}
	dir, err := urlToPath(req.SourceURL)
	if err != nil {
		return recvErr(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, snapshotConfigFile))
	if err != nil {
		return recvErr(fmt.Errorf("Error opening VM config snapshot file: %w", err))
	}
	cfg, err := parseConfig(b)
	if err != nil {
		return recvErr(fmt.Errorf("Error deserialising VM config snapshot: %w", err))
	}
	for _, f := range []string{snapshotStateFile, snapshotMemoryFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return recvErr(fmt.Errorf("Error opening VM snapshot file %s: %w", f, err))
		}
	}
	v.events.emit("vm", "restoring", nil)
	vm, aerr := v.startVM(ctx, cfg, false)
	if aerr != nil {
		aerr.chain = append([]string{act}, aerr.chain...)
		return aerr.response()
	}
	v.cfg, v.vm = cfg, vm
	v.events.emit("vm", "restored", nil)
	if req.Resume {
		if aerr := v.resume(ctx); aerr != nil {
			aerr.chain[0] = act
			return aerr.response()
		}
	}
	return noContent()
}
