package main

import (
	"strings"

	"wb/plugins/sdk"
)

func decide(in sdk.Input) sdk.Decision {
	if in.Point != sdk.PointAdmission {
		return sdk.Allow()
	}
	required, ok := sdk.Config("required")
	if !ok {
		required = "team,cost_center"
	}
	defaults := map[string]string{}
	if s, ok := sdk.Config("defaults"); ok {
		for pair := range strings.SplitSeq(s, ",") {
			if k, v, found := strings.Cut(pair, "="); found && strings.TrimSpace(k) != "" {
				defaults[strings.TrimSpace(k)] = strings.TrimSpace(v)
			}
		}
	}
	var missing, filled []string
	patch := map[string]string{}
	for key := range strings.SplitSeq(required, ",") {
		key = strings.TrimSpace(key)
		if key == "" || in.Request.Metadata[key] != "" {
			continue
		}
		if v, ok := defaults[key]; ok && v != "" {
			patch[key] = v
			filled = append(filled, key+"="+v)
			continue
		}
		missing = append(missing, key)
	}
	if len(missing) > 0 {
		return sdk.Deny("missing required metadata: " + strings.Join(missing, ", "))
	}
	if len(patch) == 0 {
		return sdk.Allow()
	}
	return sdk.Allow().WithPatch("metadata", patch).Warn("metadata defaults applied: " + strings.Join(filled, ", "))
}

func init() { sdk.Handle(decide) }

func main() {}
