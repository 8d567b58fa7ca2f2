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
