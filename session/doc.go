// Package session is the session contract as pure Go, with no I/O: the nine states and what
// each bills, the transition table with the one driver allowed to make each transition, the
// stop and fail reasons and the terminal state each leads to, tiers with their limits and
// timers, and the Session object with its JSON. Every other package speaks these types.
package session
