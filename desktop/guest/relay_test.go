package guest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestMain runs this test binary as a fake Chromium when fakeBrowserEnv is set.
func TestMain(m *testing.M) {
	if os.Getenv(fakeBrowserEnv) != "" {
		fakeBrowserMain()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const (
	fakeBrowserEnv  = "WB_TEST_FAKE_BROWSER" // its log's path
	fakeBrowserGate = "WB_TEST_FAKE_BROWSER_GATE"
	rendererDelay   = 300 * time.Millisecond
)

// fakeBrowserMain speaks the DevTools methods run_js uses on fds 3 and 4, as Chromium does
// with --remote-debugging-pipe. A page's renderer answers rendererDelay after its target is
// made. It logs each call as "METHOD session=… from=client|relay waited=… fail=… expr=…". The
// file fakeBrowserGate names holds the relay's Target.createTarget while it says "hold", and
// fails it while it says "fail".
func fakeBrowserMain() {
	in, out := os.NewFile(3, "in"), os.NewFile(4, "out")
	logf, err := os.OpenFile(os.Getenv(fakeBrowserEnv), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		panic(err)
	}
	var mu sync.Mutex
	ready := map[string]time.Time{} // session → when its renderer answers
	target := map[string]time.Time{}
	n := 0
	br := bufio.NewReader(in)
	for {
		msg, err := readMessage(br, maxCDPMessage)
		if err != nil {
			return
		}
		var m struct {
			ID        int64           `json:"id"`
			Method    string          `json:"method"`
			SessionID string          `json:"sessionId"`
			Params    json.RawMessage `json:"params"`
		}
		if err := json.Unmarshal(msg[:len(msg)-1], &m); err != nil {
			panic(err)
		}
		var p struct {
			TargetID   string `json:"targetId"`
			Expression string `json:"expression"`
			Hidden     bool   `json:"hidden"`
		}
		_ = json.Unmarshal(m.Params, &p)
		from := "client"
		if m.ID >= relayIDBase {
			from = "relay"
		}
		go func() { // each call answers on its own time, as Chromium's do
			var result any = map[string]any{}
			var fail string
			waited := false
			mu.Lock()
			n++
			k := n
			mu.Unlock()
			switch m.Method {
			case "Target.createBrowserContext":
				result = map[string]any{"browserContextId": fmt.Sprintf("ctx%d", k)}
			case "Target.createTarget":
				for from == "relay" && gate() == "hold" {
					time.Sleep(10 * time.Millisecond)
				}
				if from == "relay" && gate() == "fail" {
					fail = "refused"
					break
				}
				id := fmt.Sprintf("tgt%d", k)
				mu.Lock()
				target[id] = time.Now().Add(rendererDelay)
				mu.Unlock()
				if !p.Hidden {
					fail = "a visible target"
				}
				result = map[string]any{"targetId": id}
			case "Target.attachToTarget":
				id := fmt.Sprintf("ses%d", k)
				mu.Lock()
				ready[id] = target[p.TargetID]
				mu.Unlock()
				result = map[string]any{"sessionId": id}
			case "Runtime.evaluate":
				mu.Lock()
				at, ok := ready[m.SessionID]
				mu.Unlock()
				if !ok {
					fail = "no such session"
					break
				}
				if d := time.Until(at); d > 0 {
					waited = true
					time.Sleep(d)
				}
				v := map[string]int{"0": 0, "1+1": 2}[p.Expression]
				result = map[string]any{"result": map[string]any{"type": "number", "value": v}}
			case "Target.disposeBrowserContext":
			default:
				fail = fmt.Sprintf("'%s' wasn't found", m.Method)
			}
			mu.Lock()
			defer mu.Unlock()
			fmt.Fprintf(logf, "%s session=%s from=%s waited=%t fail=%s expr=%s\n", m.Method, m.SessionID, from, waited, fail, p.Expression)
			answer := map[string]any{"id": m.ID}
			if fail != "" {
				answer["error"] = map[string]any{"code": -32601, "message": fail}
			} else {
				answer["result"] = result
			}
			b, _ := json.Marshal(answer)
			_, _ = out.Write(append(b, 0))
		}()
	}
}

// gate is what the file fakeBrowserGate names says.
func gate() string {
	b, _ := os.ReadFile(os.Getenv(fakeBrowserGate))
	return string(b)
}

// browserLog is the fake browser's log, a line per call.
type browserLog string

func (l browserLog) lines(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(string(l))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// await waits until the log has a line after line from with every part of want, and answers
// its index.
func (l browserLog) await(t *testing.T, from int, want ...string) int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		lines := l.lines(t)
		for i := from; i < len(lines); i++ {
			if all(lines[i], want) {
				return i
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the browser saw no %q after line %d in a minute:\n%s", want, from, strings.Join(lines, "\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func all(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// TestRelaySpare: the relay keeps a browser context ready, so that a run_js call evaluates
// at once, without making a context or waiting for a renderer; it disposes of the claimed
// context once its client leaves and makes the next. A call that finds none ready makes its
// own, waits for its renderer before the script's time starts, and disposes of it.
func TestRelaySpare(t *testing.T) {
	dir := t.TempDir()
	logPath := browserLog(dir + "/browser.log")
	gate := dir + "/gate"
	t.Setenv(fakeBrowserEnv, string(logPath))
	t.Setenv(fakeBrowserGate, gate)
	sock := fmt.Sprintf("@wb-relay-test-%d", time.Now().UnixNano())
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	served := make(chan error, 1)
	go func() {
		served <- serveRelay(ctx, ln, []string{self}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	defer func() {
		cancel()
		<-served
	}()

	// The spare: made, attached, its renderer answered.
	made := logPath.await(t, 0, "Runtime.evaluate", "from=relay", "expr=0", "fail= ")
	spareSession := strings.Fields(logPath.lines(t)[made])[1] + " "

	// The browser refuses the relay's next spare (the gate is read once this call left).
	setGate := func(s string) {
		if err := os.WriteFile(gate, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	setGate("fail")
	out, err := evaluate(ctx, sock, "1+1", 5*time.Second)
	if err != nil || string(out.Value) != "2" {
		t.Fatalf("evaluate 1+1 = %s, %v", out.Value, err)
	}
	lines := logPath.lines(t)
	eval := logPath.await(t, made+1, "Runtime.evaluate", "from=client")
	if !strings.Contains(lines[eval], spareSession) || !strings.Contains(lines[eval], "waited=false") {
		t.Errorf("the call did not run at once on the spare (%s): %s", spareSession, lines[eval])
	}
	for _, l := range lines[made+1 : eval] {
		if strings.Contains(l, "from=client") {
			t.Errorf("the call made its own context although a spare was ready: %s", l)
		}
	}

	// Once it left: its context disposed of, and the next spare tried (the browser refuses it).
	disposed := logPath.await(t, eval+1, "Target.disposeBrowserContext", "from=relay")
	refused := logPath.await(t, disposed+1, "Target.createTarget", "from=relay", "fail=refused")

	// No spare: the call makes its own context, and its script runs on a renderer that
	// answers. The relay's next spare (made once this call left) is held at its page.
	setGate("hold")
	out, err = evaluate(ctx, sock, "1+1", 5*time.Second)
	if err != nil || string(out.Value) != "2" {
		t.Fatalf("evaluate 1+1 without a spare = %s, %v", out.Value, err)
	}
	own := logPath.await(t, refused+1, "Target.createTarget", "from=client")
	eval = logPath.await(t, own+1, "Runtime.evaluate", "from=client", "expr=1+1")
	if l := logPath.lines(t)[eval]; !strings.Contains(l, "waited=false") {
		t.Errorf("the script's time began before its renderer answered: %s", l)
	}
	logPath.await(t, eval+1, "Target.disposeBrowserContext", "from=client")

	// A call while the spare is being made waits for it rather than make a second.
	held := logPath.await(t, eval+1, "Target.createBrowserContext", "from=relay")
	third := make(chan error, 1)
	go func() {
		_, err := evaluate(ctx, sock, "1+1", 5*time.Second)
		third <- err
	}()
	time.Sleep(100 * time.Millisecond) // the call claims, and waits
	setGate("")
	if err := <-third; err != nil {
		t.Fatal(err)
	}
	made = logPath.await(t, held+1, "Runtime.evaluate", "from=relay", "expr=0", "fail= ")
	spareSession = strings.Fields(logPath.lines(t)[made])[1] + " "
	eval = logPath.await(t, made+1, "Runtime.evaluate", "from=client", "expr=1+1")
	lines = logPath.lines(t)
	if !strings.Contains(lines[eval], spareSession) {
		t.Errorf("the call while the spare was being made did not take it (%s): %s", spareSession, lines[eval])
	}
	for _, l := range lines[held:eval] {
		if strings.Contains(l, "from=client") && strings.HasPrefix(l, "Target.create") {
			t.Errorf("the call made a context of its own while the spare was being made: %s", l)
		}
	}
	for _, l := range logPath.lines(t) {
		if strings.Contains(l, "fail=a visible target") {
			t.Errorf("a target was made visible on the desktop's display: %s", l)
		}
	}
}
