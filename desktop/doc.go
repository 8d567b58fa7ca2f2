// Package desktop is the desktop contract (seed 001) as pure Go, with no I/O: the six states,
// the transition table with the cause of each row, sizes and the resources each gives, and
// the Desktop object with its JSON. A desktop is a long-lived object; while awake it runs as
// an ordinary session of its project. Its disk is its latest disk snapshot and its sleep is a
// memory snapshot: the store keeps the record (store/desktops.go) and the gateway drives the
// sessions and snapshots behind each transition (gateway/desktops*.go).
//
// Why a table: as with session/transition.go, every legal move is one row that names its
// cause, so "every other request answers 409 naming the state" falls out of a lookup rather
// than scattered ifs, and a test walks every (state, cause) pair against the seed's rows.
package desktop
