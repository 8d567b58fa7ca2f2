// Package session is the session contract as pure Go, with no I/O: the nine states and what
// each bills, the transition table with the one driver allowed to make each transition, the
// stop and fail reasons and the terminal state each leads to, tiers with their limits and
// timers, and the Session object with its JSON. Beside it: the create request and its
// validation, exec requests, buffered output and the lines of a streamed exec, the Snapshot,
// Run and Template objects, the list envelope (List) and the answer to a delete
// (DeletedObject), ids, and the decision points' inputs and Decision. Every other package
// speaks these types.
package session
