// Command guestinit is the init of the fake's test guests: it counts (a file in /workspace,
// so a test sees whether the guest runs) and serves a line protocol on vsock port 1024
// ($WB_VSOCK_UNIX_DIR/1024.sock): "env", "args", "count", "read PATH", "write PATH DATA",
// "exit N", "hog MIB" (a child process that takes MIB of memory and holds it, answered when
// it ends), "hoginit MIB" (init itself takes it), anything else is echoed.
package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == "hog" {
		hog(os.Args[2])
		return
	}
	var count atomic.Int64
	go func() {
		for {
			n := count.Add(1)
			_ = os.WriteFile("/workspace/counter.tmp", []byte(strconv.FormatInt(n, 10)), 0o644)
			_ = os.Rename("/workspace/counter.tmp", "/workspace/counter")
			time.Sleep(5 * time.Millisecond)
		}
	}()
	ln, err := net.Listen("unix", filepath.Join(os.Getenv("WB_VSOCK_UNIX_DIR"), "1024.sock"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "listen:", err)
		os.Exit(2)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			os.Exit(2)
		}
		go func() {
			defer c.Close()
			sc := bufio.NewScanner(c)
			for sc.Scan() {
				cmd, arg, _ := strings.Cut(sc.Text(), " ")
				var out string
				switch cmd {
				case "env":
					out = strings.Join(os.Environ(), " ")
				case "args":
					out = strings.Join(os.Args, " ")
				case "count":
					out = strconv.FormatInt(count.Load(), 10)
				case "read":
					b, err := os.ReadFile(arg)
					out = string(b)
					if err != nil {
						out = "error: " + err.Error()
					}
				case "write":
					p, data, _ := strings.Cut(arg, " ")
					out = "ok"
					if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
						out = "error: " + err.Error()
					}
				case "hog":
					// A child, so that the OOM killer takes it rather than init.
					b, err := exec.Command("/proc/self/exe", "hog", arg).CombinedOutput()
					out = strings.TrimSpace(string(b))
					if err != nil {
						out = "error: " + err.Error() + ": " + out
					}
				case "hoginit":
					hog(arg)
				case "exit":
					n, _ := strconv.Atoi(arg)
					os.Exit(n)
				default:
					out = sc.Text()
				}
				fmt.Fprintln(c, out)
			}
		}()
	}
}

// hog takes mib MiB of memory, page by page, and holds it.
func hog(mib string) {
	n, err := strconv.Atoi(mib)
	if err != nil {
		fmt.Println("hog:", err)
		os.Exit(2)
	}
	b := make([]byte, n<<20)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	fmt.Println("holding", len(b))
	time.Sleep(time.Hour)
}
