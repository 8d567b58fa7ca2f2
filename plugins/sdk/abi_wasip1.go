//go:build wasip1

package sdk

import "unsafe"

//go:wasmimport wb log
func hostLog(level int32, ptr unsafe.Pointer, n int32)

//go:wasmimport wb config_get
func hostConfigGet(keyPtr unsafe.Pointer, keyLen int32, outPtr unsafe.Pointer, outCap int32) int32

//go:wasmexport alloc
func wasmAlloc(size int32) int32 {
	if size < 0 {
		panic("sdk: alloc with a negative size")
	}
	guest.alloc(int(size))
	return int32(uintptr(unsafe.Pointer(&guest.in[0])))
}

//go:wasmexport decide
func wasmDecide(ptr, n int32) int64 {
	if n < 0 || int(n) > cap(guest.in) || (n > 0 && uintptr(ptr) != uintptr(unsafe.Pointer(&guest.in[0]))) {
		panic("sdk: decide called with a buffer that alloc did not return")
	}
	out := guest.process(guest.in[:n:n])
	if len(out) == 0 {
		return 0
	}
	return int64(uintptr(unsafe.Pointer(&out[0])))<<32 | int64(len(out))
}

// Log writes a line to the host's log, tagged with the project and the plugin. The host keeps
// at most 32 lines of 1 KiB per call.
func Log(level Level, msg string) {
	if msg == "" {
		return
	}
	hostLog(int32(level), unsafe.Pointer(unsafe.StringData(msg)), int32(len(msg)))
}

// Config answers the value of one key of the plugin's configuration (set when it was
// uploaded), and whether it is set.
func Config(key string) (string, bool) {
	if cap(guest.cfg) < 256 {
		guest.cfg = make([]byte, 256)
	}
	var kp unsafe.Pointer
	if key != "" {
		kp = unsafe.Pointer(unsafe.StringData(key))
	}
	for {
		buf := guest.cfg[:cap(guest.cfg)]
		n := hostConfigGet(kp, int32(len(key)), unsafe.Pointer(&buf[0]), int32(len(buf)))
		switch {
		case n < 0:
			return "", false
		case int(n) <= len(buf):
			return string(buf[:n]), true
		default:
			guest.cfg = make([]byte, n)
		}
	}
}
