package wb.spend_test

import data.wb.spend

caps := {"monthly_spend_cap_micro_usd": 100000000, "end_user_monthly_spend_cap_micro_usd": 5000000}

input_of(project, end_user) := {
	"project_spend_micro_usd": project,
	"end_user_spend_micro_usd": end_user,
	"end_user_id": "eu_1",
	"caps": caps,
	"plan": {"concurrency": 10, "rate_per_sec": 10},
}

test_under_caps if {
	d := spend with input as input_of(1000000, 1000)
	not d.stop_sessions
	d.deny_admission == false
	count(d.warn) == 0
}

test_project_soft_cap if {
	d := spend with input as input_of(85000000, 0)
	not d.stop_sessions
	d.deny_admission == false
	d.warn == {"project spend at 85% of its monthly cap"}
}

test_project_cap_stops_project if {
	d := spend with input as input_of(100000000, 0)
	d.stop_sessions == "project"
	d.deny_admission == true
	count(d.warn) == 0
}

test_end_user_soft_cap if {
	spend.warn == {"end user eu_1 spend at 80% of its monthly cap"} with input as input_of(0, 4000000)
}

test_end_user_cap_stops_end_user if {
	d := spend with input as input_of(1000, 6000000)
	d.stop_sessions == "end_user"
	d.deny_admission == true
}

test_project_scope_wins if {
	spend.stop_sessions == "project" with input as input_of(200000000, 6000000)
}

test_no_end_user_no_end_user_cap if {
	i := object.union(input_of(0, 9000000), {"end_user_id": ""})
	d := spend with input as i
	not d.stop_sessions
	d.deny_admission == false
}

test_missing_caps_mean_no_cap if {
	d := spend with input as {"project_spend_micro_usd": 999999999999, "end_user_id": "eu_1"}
	not d.stop_sessions
	d.deny_admission == false
	count(d.warn) == 0
}

test_zero_cap_means_no_cap if {
	i := object.union(input_of(50, 50), {"caps": {"monthly_spend_cap_micro_usd": 0, "end_user_monthly_spend_cap_micro_usd": 0}})
	d := spend with input as i
	not d.stop_sessions
	count(d.warn) == 0
}
