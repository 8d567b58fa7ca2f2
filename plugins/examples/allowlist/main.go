package main

import (
	"slices"
	"strconv"
	"strings"

	"wb/plugins/sdk"
)

var builtin = map[string][]string{"*": {"tpl_base", "tpl_dev_polyglot"}}

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
	name, _, _ := strings.Cut(in.Request.Template, "@")
	if slices.Contains(allowed, name) {
		return sdk.Allow()
	}
	return sdk.Deny("template " + strconv.Quote(in.Request.Template) + " is not on the allowlist for " + who +
		" (allowed: " + strings.Join(allowed, ", ") + ")")
}

func init() { sdk.Handle(decide) }

func main() {}
