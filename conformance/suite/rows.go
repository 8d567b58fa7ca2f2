package suite

// Rows answers every row of the suite, in the order of the report: the session object field
// by field; states and who drives each transition; pause limits per tier; snapshots; timers
// and warnings; billing per state; the failure table; desktops (seed 001), and MCP calls to them per state.
func Rows() []Row {
	var rows []Row
	for _, part := range [][]Row{objectRows(), stateRows(), transitionRows(), pauseRows(), snapshotRows(), timerRows(), billingRows(), failureRows(), desktopRows(), mcpRows()} {
		rows = append(rows, part...)
	}
	return rows
}
