package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// runGateway starts gateway i (`wb serve --runtime none`) listening on addr, its log in
// gw<i+1><suffix>.log, and answers its process and URL once it prints WB_URL.
func (f *Fleet) runGateway(ctx context.Context, i int, addr, suffix string) (*proc, string, error) {
	name := "gw" + strconv.Itoa(i+1)
	args := []string{"serve", "--addr", addr, "--runtime", "none", "--data-dir", filepath.Join(f.opts.Dir, name)}
	if f.opts.NodeTimeout > 0 {
		args = append(args, "--node-timeout", f.opts.NodeTimeout.String())
	}
	args = append(args, f.tlsArgs("gateway")...)
	stdout := filepath.Join(f.opts.Dir, name+suffix+".out")
	p, err := startProc(f.opts.Bin, append(args, f.opts.GatewayArgs...), f.env(), filepath.Join(f.opts.Dir, name+suffix+".log"), &stdout)
	if err != nil {
		return nil, "", fmt.Errorf("fleet: gateway %s: %w", name, err)
	}
	// A cold machine's first start assembles the templates: minutes, not seconds.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		b, _ := os.ReadFile(stdout)
		for _, line := range strings.Split(string(b), "\n") {
			if u, ok := strings.CutPrefix(line, "WB_URL="); ok {
				f.opts.Logf("fleet: gateway %s at %s", name, u)
				return p, u, nil
			}
		}
		if p.exited() {
			return nil, "", fmt.Errorf("fleet: gateway %s exited at start: %s", name, p.tail())
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			p.kill()
			return nil, "", fmt.Errorf("fleet: gateway %s printed no WB_URL within 3 minutes: %s", name, p.tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// gatewayProcs answers the gateways' processes as they are now.
func (f *Fleet) gatewayProcs() []*proc {
	f.gwMu.Lock()
	defer f.gwMu.Unlock()
	return slices.Clone(f.gateways)
}

func (f *Fleet) gateway(i int) (*proc, error) {
	f.gwMu.Lock()
	defer f.gwMu.Unlock()
	if i < 0 || i >= len(f.gateways) {
		return nil, fmt.Errorf("fleet: gateway %d: the fleet has %d", i, len(f.gateways))
	}
	return f.gateways[i], nil
}

// KillGateway ends gateway i (0-based, as GatewayURLs) with SIGKILL, as a host that dies
// would: whatever it was doing stops mid-way, and nothing it held is handed over.
func (f *Fleet) KillGateway(i int) error {
	p, err := f.gateway(i)
	if err != nil {
		return err
	}
	p.kill()
	return nil
}

// RestartGateway starts gateway i again after KillGateway, on its old address (so that
// GatewayURLs[i] and the clients made for it reach it again), and answers once it serves.
func (f *Fleet) RestartGateway(ctx context.Context, i int) error {
	old, err := f.gateway(i)
	if err != nil {
		return err
	}
	if !old.exited() {
		return fmt.Errorf("fleet: gateway %d is running; kill it first", i)
	}
	u, err := url.Parse(f.GatewayURLs[i])
	if err != nil {
		return fmt.Errorf("fleet: gateway %d's URL: %w", i, err)
	}
	// A log of its own for each run: the killed one's says what it was doing.
	suffix := ""
	for n := 2; ; n++ {
		suffix = "-" + strconv.Itoa(n)
		if _, err := os.Stat(filepath.Join(f.opts.Dir, "gw"+strconv.Itoa(i+1)+suffix+".log")); errors.Is(err, os.ErrNotExist) {
			break
		}
	}
	var p *proc
	var got string
	for attempt := 0; ; attempt++ {
		if p, got, err = f.runGateway(ctx, i, u.Host, suffix); err == nil {
			break
		}
		// The old port is the kernel's to give back: a few tries over a few seconds.
		if attempt == 4 || ctx.Err() != nil {
			return err
		}
		time.Sleep(time.Second)
	}
	if got != f.GatewayURLs[i] {
		p.kill()
		return fmt.Errorf("fleet: gateway %d came back at %s, not %s", i, got, f.GatewayURLs[i])
	}
	f.gwMu.Lock()
	f.gateways[i] = p
	f.gwMu.Unlock()
	return nil
}
