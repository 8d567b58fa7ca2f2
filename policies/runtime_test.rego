package wb.runtime_test

import data.wb.runtime

sess := {"id": "sess_2kQ9xwR4", "tier": 2, "end_user_id": "eu_customer_4821"}

ev(e) := object.union(e, {"session": sess})

test_egress_denied_by_default if {
	d := runtime with input as ev({"type": "egress", "host": "pypi.org", "port": 443})
	d.allow_egress == false
	d.kill == {}
}

test_kills_metadata_egress if {
	d := runtime with input as ev({"type": "egress", "host": "169.254.169.254", "port": 80})
	d.kill == {"metadata_egress": "egress to the cloud metadata endpoint 169.254.169.254:80"}
	d.allow_egress == false
}

test_kills_metadata_hostname_any_case if {
	runtime.kill.metadata_egress with input as ev({"type": "egress", "host": "Metadata.Google.Internal", "port": 80})
}

test_kills_metadata_by_resolved_address if {
	d := runtime with input as ev({"type": "egress", "host": "0xa9fea9fe", "port": 80, "addresses": ["169.254.169.254"]})
	d.kill == {"metadata_egress": "egress to the cloud metadata endpoint 0xa9fea9fe:80 (169.254.169.254)"}
	d.allow_egress == false
}

test_kills_metadata_by_any_resolved_address if {
	every a in ["169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200"] {
		runtime.kill.metadata_egress with input as ev({"type": "egress", "host": "innocent.example", "port": 443, "addresses": ["93.184.215.14", a]})
	}
}

test_kills_metadata_once_for_many_addresses if {
	d := runtime with input as ev({"type": "egress", "host": "two.example", "port": 80, "addresses": ["169.254.170.2", "169.254.169.254"]})
	d.kill == {"metadata_egress": "egress to the cloud metadata endpoint two.example:80 (169.254.169.254, 169.254.170.2)"}
}

test_kills_metadata_by_embedded_address if {
	# a NAT64 form comes with the IPv4 address it carries
	runtime.kill.metadata_egress with input as ev({"type": "egress", "host": "64:ff9b::a9fe:a9fe", "port": 80, "addresses": ["64:ff9b::a9fe:a9fe", "169.254.169.254"]})
}

test_public_addresses_survive if {
	d := runtime with input as ev({"type": "egress", "host": "pypi.org", "port": 443, "addresses": ["151.101.0.223", "2a04:4e42::223"]})
	d.kill == {}
}

test_unresolved_name_survives if {
	runtime.kill == {} with input as ev({"type": "egress", "host": "pypi.org", "port": 443})
}

test_kills_crypto_miner_exec if {
	d := runtime with input as ev({"type": "exec", "argv": ["/tmp/xmrig", "-o", "pool:3333"]})
	d.kill == {"crypto_miner": "crypto miner \"xmrig\" started"}
}

test_kills_crypto_miner_process_start if {
	runtime.kill.crypto_miner with input as ev({"type": "process_start", "argv": ["cpuminer"]})
}

test_ordinary_exec_survives if {
	d := runtime with input as ev({"type": "exec", "argv": ["python3", "-c", "print(1)"]})
	d.kill == {}
}

test_empty_argv_survives if {
	runtime.kill == {} with input as ev({"type": "exec", "argv": []})
}

test_resource_sample_survives if {
	runtime.kill == {} with input as ev({"type": "resource_sample", "cpu_ms": 1000, "memory_bytes": 1073741824})
}

test_unknown_event_survives if {
	runtime.kill == {} with input as ev({"type": "something_new"})
}
