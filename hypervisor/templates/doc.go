// Package templates assembles guest root filesystems on the host, with no download: tpl_base
// is Debian's static busybox with its applet links and the mount points a guest needs;
// tpl_dev_polyglot is the same base plus read-only binds of the host's toolchains.
//
// Each template is content-addressed: it is built in a scratch dir, digested, and moved to
// <dir>/<name>-<first 16 hex of its digest>/rootfs, so a rebuild never changes files under a
// running guest and an unchanged template is reused.
package templates
