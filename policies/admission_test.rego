package wb.admission_test

import data.wb.admission

req(tier) := {"tier": tier, "template": "tpl_dev_polyglot"}

input_of(active, concurrency, request) := {
	"request": request,
	"project_id": "proj_test",
	"plan": {"concurrency": concurrency, "rate_per_sec": 10},
	"active_sessions": active,
}

test_allows_below_limit if {
	d := admission with input as input_of(1, 10, req(2))
	count(d.deny) == 0
	count(d.warn) == 0
	d.defaults == {}
}

test_denies_at_concurrency_limit if {
	d := admission with input as input_of(10, 10, req(2))
	d.deny == {"concurrency limit reached: 10 of 10 sessions active"}
}

test_denies_over_concurrency_limit if {
	count(admission.deny) == 1 with input as input_of(12, 10, req(1))
}

test_zero_concurrency_is_unlimited if {
	d := admission with input as input_of(500, 0, req(1))
	count(d.deny) == 0
	count(d.warn) == 0
}

test_warns_at_80_percent if {
	d := admission with input as input_of(7, 10, req(2))
	count(d.deny) == 0
	d.warn == {"concurrency at 8 of 10 sessions (80% soft limit)"}
}

test_no_warning_below_80_percent if {
	count(admission.warn) == 0 with input as input_of(6, 10, req(2))
}

test_last_slot_warns_without_deny if {
	d := admission with input as input_of(9, 10, req(2))
	count(d.deny) == 0
	d.warn == {"concurrency at 10 of 10 sessions (80% soft limit)"}
}

test_denies_reserved_metadata if {
	r := object.union(req(2), {"metadata": {"wb.owner": "x", "team": "a"}})
	d := admission with input as input_of(0, 10, r)
	d.deny == {"metadata key \"wb.owner\" is reserved: the wb. prefix belongs to the platform"}
}

test_warns_long_idle_timeout_on_tier_3 if {
	r := object.union(req(3), {"idle_timeout_s": 7200})
	d := admission with input as input_of(0, 10, r)
	d.warn == {"idle_timeout_s 7200 on tier 3 keeps an idle session billing for over an hour"}
}

test_no_idle_warning_on_tier_2 if {
	r := object.union(req(2), {"idle_timeout_s": 7200})
	count(admission.warn) == 0 with input as input_of(0, 10, r)
}

test_tier_4_defaults_idle_timeout if {
	admission.defaults == {"idle_timeout_s": 120} with input as input_of(0, 10, req(4))
}

test_tier_4_explicit_idle_timeout_kept if {
	r := object.union(req(4), {"idle_timeout_s": 600})
	admission.defaults == {} with input as input_of(0, 10, r)
}

test_null_idle_timeout_counts_as_absent if {
	r := object.union(req(4), {"idle_timeout_s": null})
	admission.defaults == {"idle_timeout_s": 120} with input as input_of(0, 10, r)
}
