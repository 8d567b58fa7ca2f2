// Package cli is the `wb` command line for callers of the public API: sessions (create, ls,
// get, exec, pty, pause, resume, snapshot, rm), runs, snapshots, policies, plugins, usage,
// webhooks and desktops, plus shell completion. It is a thin layer over the Go SDK
// (wb/client): it owns configuration (flags, then WB_URL/WB_API_KEY, then a profile file),
// rendering (tables, or the API's objects with -o json), progress on a terminal, and the
// interactive terminal of `wb pty`. cmd/wb dispatches the command names of Handles to Run;
// the operator's commands (serve, node, agent, …) stay there.
//
// Cobra (spf13/cobra) carries the command tree: it gives nested help with examples, flag
// parsing, and the bash/zsh/fish completion scripts (with session ids completed from the
// API) that the standard flag package would make us write by hand.
package cli
