package datadir

import (
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
)

// CgroupName is the cgroup directory (below /wb, or /wb-cloudhv) of the guests of node id on
// data dir dir: the id and a digest of the dir's absolute path, so that two nodes on one host
// never share one. The reapers of stopped nodes (internal/fleet) find it by the same name.
func CgroupName(dir, id string) string {
	abs, _ := filepath.Abs(dir)
	sum := sha256.Sum256([]byte(abs))
	return id + "-" + hex.EncodeToString(sum[:4])
}
