//go:build !wasip1

package sdk

import (
	"fmt"
	"os"
	"sync"
)

// Outside WebAssembly (go vet, unit tests of a plugin's logic) Log prints to stderr and Config
// answers what SetTestConfig set.

var testConfig struct {
	sync.Mutex
	m map[string]string
}

// Log prints the line to stderr.
func Log(level Level, msg string) { fmt.Fprintf(os.Stderr, "plugin log %d: %s\n", level, msg) }

// Config answers a key of the configuration that SetTestConfig set.
func Config(key string) (string, bool) {
	testConfig.Lock()
	defer testConfig.Unlock()
	v, ok := testConfig.m[key]
	return v, ok
}

// SetTestConfig sets what Config answers outside WebAssembly.
func SetTestConfig(m map[string]string) {
	testConfig.Lock()
	defer testConfig.Unlock()
	testConfig.m = m
}

// Invoke runs the handler on a JSON input as the host would and answers the JSON result; for
// unit tests of a plugin's logic outside WebAssembly.
func Invoke(input []byte) (out []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	return append([]byte(nil), guest.process(input)...), nil
}
