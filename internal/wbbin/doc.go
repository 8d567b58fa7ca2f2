// Package wbbin owns the binaries that other packages' tests run: wb as a server process
// (Install, WB_TEST_BIN) and the static agent that guests run (Agent, WB_TEST_AGENT_BIN,
// built from cmd/wb-agent; Install puts it beside wb, where wb looks for it). `make test`
// builds each once and names them in those variables, so that the test binaries that need
// them share one build; a package tested alone builds its own.
package wbbin
