package cloudhv

// ConsoleRelayed reports whether d copies guest id's console terminal into its console log.
func ConsoleRelayed(d *Driver, id string) bool {
	_, ok := d.consoles.Load(id)
	return ok
}
