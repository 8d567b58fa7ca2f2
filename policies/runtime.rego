# Platform runtime policy: evaluated for every guest event the node reports, together with
# the session's pinned policy (policy_id).
#
# Input:  one event, plus the session it came from:
#           {"type": "exec",            "argv": [...]}   (a PTY: "pty": true, argv ["/bin/sh", "-c", cmd])
#           {"type": "process_start",   "argv": [...]}
#           {"type": "egress",          "host": "...", "port": n}
#           {"type": "resource_sample", "cpu_ms": n, "memory_bytes": n}
#         and "session": {"id", "tier", "end_user_id", ...}
# Output: kill         object rule name -> message (a set of rule names is accepted too);
#                      any entry kills the session with reason policy_violation
#         allow_egress boolean, default false; true lets an egress event through
package wb.runtime

default allow_egress := false

# Cloud instance metadata endpoints: a guest must never reach the host's credentials.
metadata_hosts := {
	"169.254.169.254",
	"169.254.170.2",
	"fd00:ec2::254",
	"100.100.100.200",
	"metadata.google.internal",
	"metadata.goog",
}

kill.metadata_egress := msg if {
	input.type == "egress"
	lower(input.host) in metadata_hosts
	msg := sprintf("egress to the cloud metadata endpoint %s:%v", [input.host, input.port])
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
