// Package wbbin owns the static wb binary that other packages' tests run, as a process or as
// a guest's agent. `make test` builds it once and names it in WB_TEST_BIN, so that the test
// binaries that need it (cmd/wb, conformance, node, hypervisor/oci) share one build; a package
// tested alone builds its own from this module.
package wbbin
