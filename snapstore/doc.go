// Package snapstore owns where snapshot files live once a node has taken them: an object
// store (an S3-compatible bucket, or a directory) that any node can restore from.
//
// A snapshot is stored content-addressed: each of its files under its SHA-256
// (snapshots/ID/sha256/HEX) and a manifest (snapshots/ID/manifest.json: paths → digests,
// sizes, modes) written last, so that a snapshot without its manifest was never completely
// uploaded and is never restored. Get verifies every file's size and digest while it
// downloads into a temporary directory beside the target and renames it into place only
// when all match: a corrupt object fails the restore, never restores garbage, and a target
// directory is never half-present.
//
// Blobs are not shared between snapshots: identical files in two snapshots are stored
// twice, under each snapshot's own prefix, so that deleting one snapshot (its whole prefix)
// can never remove what another needs, without reference counts kept across nodes. Memory
// images and disk layers of different snapshots rarely coincide; sharing is left for when
// they do (reference sets in Redis).
package snapstore
