package cloudhv

// ConsoleRelayed reports whether d copies guest id's console terminal into its console log.
func ConsoleRelayed(d *Driver, id string) bool {
	_, ok := d.copies.Load(copyKey{id, consoleFile})
	return ok
}

// PipesCopied reports whether d copies guest id's VMM log and event pipes, and neither copy
// has ended.
func PipesCopied(d *Driver, id string) bool {
	return d.copying(id, vmmLogFile) && d.copying(id, eventsFile)
}

// RootFSImage is the root disk image guest id runs on, as its record names it.
func RootFSImage(d *Driver, id string) (string, error) {
	r, err := d.load(id)
	return r.RootFS, err
}
