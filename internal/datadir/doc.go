// Package datadir owns the lock that gives one `wb serve` or `wb node` a data directory to
// itself: an exclusive flock on <dir>/wb.lock, taken before anything else in the directory is
// read or written, and naming its holder (pid, command, start time) to whoever is turned away.
// The kernel drops the lock when the holder's process ends, however it ends.
package datadir
