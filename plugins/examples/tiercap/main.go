package main

import (
	"strconv"
	"strings"

	"wb/plugins/sdk"
)

const defaultCaps = "free_=1,trial_=2"

// capFor answers the cap of the longest prefix of user in caps.
func capFor(caps, user string) (prefix string, tier int, ok bool) {
	for pair := range strings.SplitSeq(caps, ",") {
		p, t, found := strings.Cut(pair, "=")
		p = strings.TrimSpace(p)
		n, err := strconv.Atoi(strings.TrimSpace(t))
		if !found || err != nil || !strings.HasPrefix(user, p) || len(p) < len(prefix) || (ok && len(p) == len(prefix)) {
			continue
		}
		prefix, tier, ok = p, n, true
	}
	return prefix, tier, ok
}

func decide(in sdk.Input) sdk.Decision {
	if in.Point != sdk.PointAdmission || in.Request.Tier == nil {
		return sdk.Allow()
	}
	caps, ok := sdk.Config("caps")
	if !ok {
		caps = defaultCaps
	}
	prefix, limit, ok := capFor(caps, in.Request.EndUserID)
	asked := *in.Request.Tier
	if !ok || asked <= limit {
		return sdk.Allow()
	}
	who := "end users with the prefix " + strconv.Quote(prefix)
	if mode, _ := sdk.Config("mode"); mode == "deny" {
		return sdk.Deny("tier " + strconv.Itoa(asked) + " is above the cap of tier " + strconv.Itoa(limit) + " for " + who)
	}
	sdk.Log(sdk.LevelInfo, "lowering tier "+strconv.Itoa(asked)+" to "+strconv.Itoa(limit)+" for "+in.Request.EndUserID)
	return sdk.Allow().WithPatch("tier", limit).
		Warn("tier lowered from " + strconv.Itoa(asked) + " to " + strconv.Itoa(limit) + ": " + who + " are capped at tier " + strconv.Itoa(limit))
}

func init() { sdk.Handle(decide) }

func main() {}
