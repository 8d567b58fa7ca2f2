package cloudhv

// ConsoleRelayed reports whether d copies guest id's console terminal into its console log.
func ConsoleRelayed(d *Driver, id string) bool {
	_, ok := d.consoles.Load(id)
	return ok
}

// VMMLogCopied reports whether d copies guest id's VMM log pipe into its vmm.log, and the copy
// has not ended.
func VMMLogCopied(d *Driver, id string) bool {
	v, ok := d.vmmLogs.Load(id)
	if !ok {
		return false
	}
	select {
	case <-v.(*logCopy).done:
		return false
	default:
		return true
	}
}
