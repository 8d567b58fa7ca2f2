# Platform runtime policy: evaluated for every guest event the node reports, together with
# the session's pinned policy (policy_id).
#
# Input:  one event, plus the session it came from:
#           {"type": "exec",            "argv": [...]}   (a PTY: "pty": true, argv ["/bin/sh", "-c", cmd])
#           {"type": "process_start",   "argv": [...]}
#           {"type": "egress",          "host": "...", "port": n, "addresses": [...]}
#           {"type": "resource_sample", "cpu_ms": n, "memory_bytes": n}
#         and "session": {"id", "tier", "end_user_id", ...}
#         An egress event's "addresses" are what the host resolved to, each in every form a
#         rule must match (an IPv4-mapped address as IPv4; a NAT64 or 6to4 one with its IPv4
#         address too). A numeric host, in any spelling ("0xa9fea9fe"), comes with its address;
#         a name is first asked about without "addresses" (it is not resolved before a policy
#         allows it), then again with them. Whatever a policy allows, the node never dials
#         loopback, private, link-local or the platform's own addresses.
# Output: kill         object rule name -> message (a set of rule names is accepted too);
#                      any entry kills the session with reason policy_violation
#         allow_egress boolean, default false; true lets an egress event through
package wb.runtime

default allow_egress := false

# Cloud instance metadata endpoints: a guest must never reach the host's credentials. A rule
# on names alone would miss "0xa9fea9fe" or a name of the guest's that resolves there, so the
# addresses match too.
metadata_addresses := {
	"169.254.169.254",
	"169.254.170.2",
	"fd00:ec2::254",
	"100.100.100.200",
}

metadata_hosts := metadata_addresses | {
	"metadata.google.internal",
	"metadata.goog",
}

kill.metadata_egress := msg if {
	input.type == "egress"
	lower(input.host) in metadata_hosts
	msg := sprintf("egress to the cloud metadata endpoint %s:%v", [input.host, input.port])
}

kill.metadata_egress := msg if {
	input.type == "egress"
	not lower(input.host) in metadata_hosts
	hits := {addr | some addr in input.addresses; addr in metadata_addresses}
	count(hits) > 0
	msg := sprintf("egress to the cloud metadata endpoint %s:%v (%s)", [input.host, input.port, concat(", ", sort(hits))])
}

miners := {"xmrig", "xmr-stak", "minerd", "cpuminer", "ethminer", "nbminer", "t-rex", "lolminer"}

program := name if {
	input.type in {"exec", "process_start"}
	parts := split(input.argv[0], "/")
	name := lower(parts[count(parts) - 1])
}

kill.crypto_miner := msg if {
	program in miners
	msg := sprintf("crypto miner %q started", [program])
}
