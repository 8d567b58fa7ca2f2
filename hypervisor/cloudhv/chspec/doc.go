// Package chspec holds Cloud Hypervisor's published REST API description
// (cloud-hypervisor.yaml, Apache-2.0, copied unmodified; see NOTICE) and checks HTTP
// exchanges against it, allowing exactly the deviations of the real server that
// ../shared/specs/SOURCES.md lists. The client's tests and the fake VMM (chvtest) both use
// it, so neither can drift from the document without a test failing.
package chspec
