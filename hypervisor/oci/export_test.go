package oci

import "path/filepath"

// KernelTaskFiles points o at stand-ins for /proc/sys/kernel/pid_max and threads-max.
func KernelTaskFiles(o *Options, pidMax, threadsMax string) {
	o.pidMaxFile, o.threadsMaxFile = pidMax, threadsMax
}

// PidsFile is file (pids.current, pids.max, pids.events) of cgroup p in d's pids hierarchy.
func PidsFile(d *Driver, p, file string) string { return filepath.Join(d.cg.pidsDir(p), file) }

// RemoveCgroup removes cgroup p's (empty) directories in every hierarchy.
func RemoveCgroup(d *Driver, p string) error { return d.cg.removeDirs(p) }

// FailConsole makes each of d's opens of a guest's console log fail with err: a failure
// after prepare, whose leftovers the tests look for.
func (d *Driver) FailConsole(err error) { d.consoleFault = err }
