# Platform admission policy: evaluated for every POST /v1/sessions before a session is
# created, together with the project's own admission policies.
#
# Input:  {"request": CreateRequest, "project_id": string,
#          "plan": {"concurrency": n, "rate_per_sec": n}, "active_sessions": n}
# Output: deny     set of messages; any message denies the create
#         warn     set of messages; surfaced to the caller, never deny
#         defaults object: a merge patch on the request (null removes a field)
#
# defaults is applied as a JSON merge patch (RFC 7386): a value sets the field, over the
# caller's; an object merges key by key; null removes the field. A patch may touch only tier,
# resources, idle_timeout_s, max_lifetime_s and metadata (no wb.* key). Any other field
# (template, region, restore_from, policy_id, volume_id, end_user_id) denies the create,
# naming the field and the policy; the patched request is validated again in full.
package wb.admission

# concurrency <= 0 means the plan sets no concurrency limit.
limited if input.plan.concurrency > 0

deny contains msg if {
	limited
	input.active_sessions >= input.plan.concurrency
	msg := sprintf("concurrency limit reached: %d of %d sessions active", [input.active_sessions, input.plan.concurrency])
}

# The wb. metadata namespace belongs to the platform.
deny contains msg if {
	some key, _ in input.request.metadata
	startswith(key, "wb.")
	msg := sprintf("metadata key %q is reserved: the wb. prefix belongs to the platform", [key])
}

# Soft limit: this session takes the project to 80 % or more of its concurrency.
warn contains msg if {
	limited
	input.active_sessions < input.plan.concurrency
	(input.active_sessions + 1) * 100 >= input.plan.concurrency * 80
	msg := sprintf("concurrency at %d of %d sessions (80%% soft limit)", [input.active_sessions + 1, input.plan.concurrency])
}

warn contains msg if {
	input.request.tier >= 3
	input.request.idle_timeout_s > 3600
	msg := sprintf("idle_timeout_s %d on tier %d keeps an idle session billing for over an hour", [input.request.idle_timeout_s, input.request.tier])
}

# Tier 4 is the most expensive tier: a forgotten session stops after two idle minutes
# unless the caller asks for longer.
defaults.idle_timeout_s := 120 if {
	input.request.tier == 4
	object.get(input.request, "idle_timeout_s", null) == null
}
