# Platform spend policy: evaluated when the metering pipeline updates a project's or an end
# user's month-to-date spend, together with the project's own spend policies.
#
# Input:  {"project_spend_micro_usd": n, "end_user_spend_micro_usd": n, "end_user_id": "...",
#          "caps": {"monthly_spend_cap_micro_usd": n, "end_user_monthly_spend_cap_micro_usd": n},
#          "plan": {...}}
#         A cap that is absent or <= 0 is no cap.
# Output: stop_sessions  "project" | "end_user"; undefined when nothing must stop
#         deny_admission boolean, default false: refuse new sessions in that scope
#         warn           set of messages (soft cap at 80 %)
package wb.spend

default deny_admission := false

project_cap := object.get(input, ["caps", "monthly_spend_cap_micro_usd"], 0)

end_user_cap := object.get(input, ["caps", "end_user_monthly_spend_cap_micro_usd"], 0)

project_spend := object.get(input, "project_spend_micro_usd", 0)

end_user_spend := object.get(input, "end_user_spend_micro_usd", 0)

end_user := object.get(input, "end_user_id", "")

project_over if {
	project_cap > 0
	project_spend >= project_cap
}

end_user_over if {
	end_user_cap > 0
	end_user != ""
	end_user_spend >= end_user_cap
}

stop_sessions := "project" if {
	project_over
} else := "end_user" if {
	end_user_over
}

deny_admission if project_over

deny_admission if end_user_over

warn contains msg if {
	project_cap > 0
	not project_over
	project_spend * 100 >= project_cap * 80
	msg := sprintf("project spend at %d%% of its monthly cap", [floor((project_spend * 100) / project_cap)])
}

warn contains msg if {
	end_user_cap > 0
	end_user != ""
	not end_user_over
	end_user_spend * 100 >= end_user_cap * 80
	msg := sprintf("end user %s spend at %d%% of its monthly cap", [end_user, floor((end_user_spend * 100) / end_user_cap)])
}
