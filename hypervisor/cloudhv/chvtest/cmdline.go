package chvtest

import (
	"strings"
)

// kernelParams are the command-line words the fake's "kernel" consumes itself (Linux would
// too), so they reach neither init's environment nor its arguments.
var kernelParams = map[string]bool{
	"console": true, "root": true, "rootfstype": true, "rootflags": true, "rootwait": true,
	"ro": true, "rw": true, "init": true, "panic": true, "quiet": true, "debug": true,
	"loglevel": true, "earlyprintk": true, "reboot": true, "nokaslr": true, "noapic": true,
	"nomodules": true, "pci": true, "i8042.noaux": true, "tsc": true, "mitigations": true,
	"ip": true, // the guest's address: the fake's kernel configures its interface (net.go)
}

// initProcess is what Linux makes of a command line for init.
type initProcess struct {
	Path string   // init= (default /sbin/init)
	Args []string // argv[1:]
	Env  []string // HOME=/, TERM=linux, then the unknown KEY=VALUE words
}

// parseCmdline splits cmdline as Linux's init/main.c does: words after " -- " are init's
// arguments; before it, a word whose name the kernel knows is the kernel's, a "key.x=..."
// word is a module parameter, an unknown KEY=VALUE word goes to init's environment and any
// other unknown word to init's arguments. (No quoting: the driver's command lines have none.)
func parseCmdline(cmdline string) initProcess {
	p := initProcess{Path: "/sbin/init", Env: []string{"HOME=/", "TERM=linux"}}
	words := strings.Fields(cmdline)
	var pre, post []string
	pre = words
	for i, w := range words {
		if w == "--" {
			pre, post = words[:i], words[i+1:]
			break
		}
	}
	for _, w := range pre {
		key, val, hasVal := strings.Cut(w, "=")
		switch {
		case key == "init" && hasVal:
			p.Path = val
		case kernelParams[key] || kernelParams[w]:
		case strings.Contains(key, "."):
		case hasVal:
			p.Env = append(p.Env, w)
		default:
			p.Args = append(p.Args, w)
		}
	}
	p.Args = append(p.Args, post...)
	return p
}
