// Command allowlist is a wb plugin that denies templates that are not on an allowlist for the
// end user of a create request (admission point; other points are allowed).
//
// Configuration key "allowlist": entries separated by ";", each END_USER=TEMPLATE,TEMPLATE…
// where END_USER "*" applies to every end user without an entry of their own and to requests
// without an end_user_id. Without the key the built-in list allows base, python and node to
// everyone.
//
//	allowlist = "alice=python,node;bob=base;*=base"
package main

import (
	"slices"
	"strconv"
	"strings"

	"wb/plugins/sdk"
)

var builtin = map[string][]string{"*": {"base", "python", "node"}}

func parse(s string) map[string][]string {
	m := map[string][]string{}
	for entry := range strings.SplitSeq(s, ";") {
		user, tpls, ok := strings.Cut(entry, "=")
		if !ok {
			continue
		}
		var list []string
		for t := range strings.SplitSeq(tpls, ",") {
			if t = strings.TrimSpace(t); t != "" {
				list = append(list, t)
			}
		}
		m[strings.TrimSpace(user)] = list
	}
	return m
}

func decide(in sdk.Input) sdk.Decision {
	if in.Point != sdk.PointAdmission {
		return sdk.Allow()
	}
	lists := builtin
	if s, ok := sdk.Config("allowlist"); ok {
		lists = parse(s)
	}
	user := in.Request.EndUserID
	allowed, ok := lists[user]
	if !ok || user == "" {
		allowed, ok = lists["*"]
	}
	who := "end user " + strconv.Quote(user)
	if user == "" {
		who = "requests without an end user"
	}
	if !ok {
		return sdk.Deny("no template is allowed for " + who)
	}
	if slices.Contains(allowed, in.Request.Template) {
		return sdk.Allow()
	}
	return sdk.Deny("template " + strconv.Quote(in.Request.Template) + " is not on the allowlist for " + who +
		" (allowed: " + strings.Join(allowed, ", ") + ")")
}

func init() { sdk.Handle(decide) }

func main() {}
