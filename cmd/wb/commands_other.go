//go:build !linux

package main

import (
	"context"
	"fmt"
	"io"
	"runtime"

	"github.com/redis/go-redis/v9"
)

// The commands that run guests, or run inside one, need Linux (cgroups, mounts, runc, runsc,
// Cloud Hypervisor, vsock): their files build on Linux only, and elsewhere, where wb is the
// callers' CLI, these say so instead of doing part of the work.

func serve(context.Context, []string, io.Writer, io.Writer) error {
	return linuxOnly("serve", "it runs the guests of the platform on this machine (runc, runsc or Cloud Hypervisor, in cgroups); run it on a Linux host and use it from here with $WB_URL and $WB_API_KEY")
}

func nodeCmd(context.Context, []string, io.Writer) error {
	return linuxOnly("node", "it runs guests under runc, runsc or Cloud Hypervisor, in cgroups of this machine")
}

func fleetCmd(context.Context, []string, io.Writer, io.Writer) error {
	return linuxOnly("fleet", "its nodes run guests under runc or runsc")
}

func imageCmd(context.Context, []string, io.Writer, io.Writer) error {
	return linuxOnly("image", "it assembles a Cloud Hypervisor guest image with apt-get, dpkg-deb, mkfs.ext4 and busybox")
}

func agentCmd(context.Context, []string, io.Writer) error {
	return linuxOnly("agent", "it runs inside a guest, a Linux of its own")
}

func loadOnFleet(context.Context, loadOpts, io.Writer, func(loadOpts, redis.UniversalClient, guestLister) error) error {
	return linuxOnly("load --fleet", "it starts a fleet on this machine, whose nodes run guests; give --url and --key of a deployment instead")
}

func linuxOnly(command, why string) error {
	return fmt.Errorf("wb %s runs only on Linux: %s (this is %s/%s)", command, why, runtime.GOOS, runtime.GOARCH)
}
