package cloudhv

// StopRelay ends the egress relay this process serves for guest id, as the end of a node's
// process does (the guest's namespace and VMM stay).
func StopRelay(d *Driver, id string) { d.stopRelay(id) }
