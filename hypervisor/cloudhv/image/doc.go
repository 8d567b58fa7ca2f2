// Package image assembles Cloud Hypervisor guest images (`wb image build`): a kernel, an
// initramfs that loads its virtio drivers, and raw ext4 disks whose init is `wb agent`.
//
//   - Build downloads Debian's linux-image-cloud-amd64 with apt-get (cached by package and
//     version), takes its vmlinuz (Cloud Hypervisor boots a bzImage directly), and writes an
//     initramfs holding busybox and the modules that kernel needs for the VM's devices (virtio
//     PCI, block, console, net, vsock; Debian builds them as modules) in dependency order read
//     from each module's .modinfo; its /init loads them, configures the static address of the
//     command line's ip= (the driver's guest network), mounts root= read-only and switches to
//     init= with the kernel command line's arguments and environment. It also lays out a busybox
//     root filesystem with the wb binary at /run/wb-bin/wb (and /sbin/init → it), makes it an
//     ext4 image with mkfs.ext4 -d, and writes manifest.json (files, sizes, SHA-256s, cmdline).
//   - RootFSImage makes the rootfs disk of a node's template (a directory, see
//     hypervisor/templates) plus the wb binary, cached by content digest; WritableDisk makes a
//     guest's writable disk (workspace/, tmp/, root/: hypervisor.WritableMounts).
//
// Both disks carry what the agent's VM mode expects (agent.VMWritableDir as the writable
// disk's mount point). The package runs host tools: apt-get and dpkg-deb (only to download a
// kernel), mkfs.ext4, and cp.
package image
