package chvtest

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"wb/internal/proc"
)

// ownerFile names, in a state dir fakech made for itself, the process that made it: its pid
// and start time.
const ownerFile = "fakech.owner"

// ClaimStateDir marks dir as this process's, for ReapStale.
func ClaimStateDir(dir string) error {
	pid := os.Getpid()
	start, ok := proc.Start(pid)
	if !ok {
		return fmt.Errorf("chvtest: this process's start time is unknown")
	}
	return os.WriteFile(filepath.Join(dir, ownerFile), []byte(ownerLine(pid, start)), 0o644)
}

// ReapStale removes the state dirs (parent/<prefix>*) that fakech processes killed with
// SIGKILL left behind, with their guest's mounts (loop-mounted disks, whose loop devices
// and deleted images live on while mounted): a dir whose owner file names a process that is
// gone. A dir without one is left alone: its fakech may be starting. It answers how many it
// removed.
func ReapStale(parent, prefix string, log *slog.Logger) int {
	dirs, _ := filepath.Glob(filepath.Join(parent, prefix+"*"))
	n := 0
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue
		}
		var pid int
		var start string
		if _, err := fmt.Sscanf(string(b), "%d %s", &pid, &start); err != nil || proc.Alive(pid, start) {
			continue
		}
		if err := unmountBelow(dir); err != nil {
			log.Warn("stale state dir: unmount", "dir", dir, "err", err)
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			log.Warn("stale state dir: remove", "dir", dir, "err", err)
			continue
		}
		log.Info("removed the state dir of a fakech that was killed", "dir", dir, "pid", pid)
		n++
	}
	return n
}

// unmountBelow unmounts every mount at or below dir, deepest first.
func unmountBelow(dir string) error {
	ms, err := mounts()
	if err != nil {
		return err
	}
	dir = filepath.Clean(dir)
	var points []string
	for _, m := range ms {
		if m.point == dir || strings.HasPrefix(m.point, dir+"/") {
			points = append(points, m.point)
		}
	}
	slices.SortFunc(points, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	for _, p := range points {
		if err := unmount(p); err != nil {
			return fmt.Errorf("unmount %s: %w", p, err)
		}
	}
	return nil
}

// ownerLine is the owner file's content for pid and start.
func ownerLine(pid int, start string) string { return strconv.Itoa(pid) + " " + start + "\n" }
