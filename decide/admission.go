package decide

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"wb/internal/mergepatch"
	"wb/plugins"
	"wb/session"
)

// PatchableFields are the fields of a create request an admission patch may set, change or
// remove: limits and labels. What the session runs (template, restore_from, volume_id), where
// (region), under which runtime policy (policy_id) and who pays (end_user_id) stay the caller's.
// A patch touching any other field is a deny of its decider (fail closed). The patched request
// is validated again in full by the gateway (ranges, tier limits, references).
var PatchableFields = []string{"tier", "resources", "idle_timeout_s", "max_lifetime_s", "metadata"}

// PatchError is a decider's patch that cannot be applied: it touches a field outside
// PatchableFields or a reserved metadata key, or cannot be composed with an earlier decider's
// patch. The create is refused (403) naming the decider and the field.
type PatchError struct {
	Decider string
	Field   string // "metadata.wb.owner", "resources"
	Reason  string // the whole sentence, decider and field included
}

func (e *PatchError) Error() string { return e.Reason }

// CheckPatch answers why a decider's patch may not be applied, or nil.
func CheckPatch(decider string, patch map[string]any) *PatchError {
	if decider == "" {
		decider = "an admission decider"
	}
	keys := make([]string, 0, len(patch))
	for k := range patch {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !slices.Contains(PatchableFields, k) {
			return &PatchError{Decider: decider, Field: k,
				Reason: fmt.Sprintf("%s: a patch may not set %q (patchable fields: %s)", decider, k, strings.Join(PatchableFields, ", "))}
		}
	}
	if md, ok := patch["metadata"].(map[string]any); ok {
		mk := make([]string, 0, len(md))
		for k := range md {
			mk = append(mk, k)
		}
		sort.Strings(mk)
		for _, k := range mk {
			if session.ReservedMetadataKey(k) {
				return &PatchError{Decider: decider, Field: "metadata." + k,
					Reason: fmt.Sprintf("%s: a patch may not set metadata key %q: the %s prefix belongs to the platform", decider, k, session.ReservedMetadataPrefix)}
			}
		}
	}
	return nil
}

// Admit is the admission point: the platform's and the project's Rego policies, then the
// project's plugins in order, combined by Combine. It fails closed: an error when the platform's
// Rego or the plugin host cannot decide, a *PatchError when a decider's patch may not be
// applied.
func (d Decider) Admit(ctx context.Context, in session.AdmissionInput) (session.Decision, error) {
	var ds []session.Decision
	if d.Policies != nil {
		pd, err := d.Policies.Admit(ctx, in)
		if err != nil {
			return session.Decision{}, fmt.Errorf("admission policies: %w", err)
		}
		ds = append(ds, pd)
	}
	if d.Plugins != nil {
		input, err := plugins.Admission(in, d.now()).Marshal()
		if err != nil {
			return session.Decision{}, fmt.Errorf("admission plugins: %w", err)
		}
		pds, err := d.Plugins.Decide(ctx, in.ProjectID, session.PointAdmission, input)
		if err != nil {
			return session.Decision{}, fmt.Errorf("admission plugins: %w", err)
		}
		ds = append(ds, pds...)
	}
	out, perr := combine(ds)
	if perr != nil {
		return session.Decision{}, perr
	}
	return out, nil
}

// Combine merges decisions: allowed only if all allow; every decider's warnings are kept; the
// reasons of every decider that denied are returned. A decision whose patch may not be applied
// (CheckPatch, or a patch that cannot follow an earlier one, see mergepatch.Inexact) counts as
// a deny of its decider and its patch is dropped. The other patches compose in order into one
// merge patch with the effect of applying them one after another: a later value wins, and a
// null is kept, so it still removes the field from the request.
func Combine(ds ...session.Decision) session.Decision {
	out, _ := combine(ds)
	return out
}

// combine is Combine, also answering the first patch that could not be applied.
func combine(ds []session.Decision) (session.Decision, *PatchError) {
	out := session.Decision{Allow: true}
	var first *PatchError
	var deciders []string
	acc := map[string]any{}
	for _, d := range ds {
		if d.Decider != "" {
			deciders = append(deciders, d.Decider)
		}
		out.Warnings = append(out.Warnings, d.Warnings...)
		perr := CheckPatch(d.Decider, d.Patch)
		if perr == nil && len(d.Patch) > 0 {
			if path, bad := mergepatch.Inexact(acc, d.Patch); bad {
				field := strings.Join(path, ".")
				perr = &PatchError{Decider: d.Decider, Field: field, Reason: fmt.Sprintf(
					"%s: its patch sets %q to an object after an earlier decider set it to null or a value that is not an object; one merge patch cannot express both in order: set the whole value in one decider",
					deciderName(d.Decider), field)}
			}
		}
		if perr != nil {
			if first == nil {
				first = perr
			}
			d.Allow, d.Reasons, d.Patch = false, append(slices.Clip(d.Reasons), perr.Reason), nil
		}
		if !d.Allow {
			out.Allow = false
			for _, r := range d.Reasons {
				if strings.HasPrefix(d.Decider, "plugin ") && !strings.HasPrefix(r, d.Decider) {
					r = d.Decider + ": " + r
				}
				out.Reasons = append(out.Reasons, r)
			}
			if len(d.Reasons) == 0 {
				out.Reasons = append(out.Reasons, "denied by "+deciderName(d.Decider))
			}
		}
		if len(d.Patch) > 0 {
			acc = mergepatch.Compose(acc, d.Patch).(map[string]any)
		}
	}
	if len(acc) > 0 {
		out.Patch = acc
	}
	out.Decider = strings.Join(deciders, ", ")
	return out, first
}

func deciderName(d string) string {
	if d == "" {
		return "an admission decider"
	}
	return d
}
