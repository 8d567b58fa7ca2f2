// Package plugins is the wazero host for tenants' WebAssembly decision plugins: the ABI, the
// compile cache, bounded instance pools, memory and time limits. plugins/sdk is for authors.
package plugins
