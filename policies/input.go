package policies

import (
	"github.com/open-policy-agent/opa/v1/ast"

	"wb/session"
)

// admissionValue converts the admission input to the AST value its JSON encoding would
// parse to, without going through JSON (the hot path of every create). TestAdmissionValue
// checks it against the JSON round trip with every field set, so a field added to
// session.CreateRequest without being added here fails the tests.
func admissionValue(in session.AdmissionInput) ast.Value {
	r := in.Request
	req := make([][2]*ast.Term, 0, 12)
	add := func(k string, v *ast.Term) { req = append(req, [2]*ast.Term{ast.InternedTerm(k), v}) }
	str := func(k, v string) {
		if v != "" {
			add(k, ast.StringTerm(v))
		}
	}
	num := func(k string, v *int) {
		if v != nil {
			add(k, ast.InternedTerm(*v))
		}
	}
	if r.Tier != nil {
		add("tier", ast.InternedTerm(*r.Tier))
	} else {
		add("tier", ast.InternedNullTerm)
	}
	str("template", r.Template)
	str("region", r.Region)
	if rr := r.Resources; rr != nil {
		res := make([][2]*ast.Term, 0, 4)
		if rr.SizeClass != "" {
			res = append(res, ast.Item(ast.InternedTerm("size_class"), ast.StringTerm(rr.SizeClass)))
		}
		for _, f := range []struct {
			k string
			v *int
		}{{"vcpu", rr.VCPU}, {"memory_mib", rr.MemoryMiB}, {"disk_gib", rr.DiskGiB}} {
			if f.v != nil {
				res = append(res, ast.Item(ast.InternedTerm(f.k), ast.InternedTerm(*f.v)))
			}
		}
		add("resources", ast.NewTerm(ast.NewObject(res...)))
	}
	num("idle_timeout_s", r.IdleTimeoutS)
	num("max_lifetime_s", r.MaxLifetimeS)
	str("end_user_id", r.EndUserID)
	str("policy_id", r.PolicyID)
	str("volume_id", r.VolumeID)
	str("restore_from", r.RestoreFrom)
	if len(r.Metadata) > 0 {
		md := make([][2]*ast.Term, 0, len(r.Metadata))
		for k, v := range r.Metadata {
			md = append(md, ast.Item(ast.StringTerm(k), ast.StringTerm(v)))
		}
		add("metadata", ast.NewTerm(ast.NewObject(md...)))
	}
	return ast.NewObject(
		ast.Item(ast.InternedTerm("request"), ast.NewTerm(ast.NewObject(req...))),
		ast.Item(ast.InternedTerm("project_id"), ast.StringTerm(in.ProjectID)),
		ast.Item(ast.InternedTerm("plan"), ast.NewTerm(ast.NewObject(
			ast.Item(ast.InternedTerm("concurrency"), ast.InternedTerm(in.Plan.Concurrency)),
			ast.Item(ast.InternedTerm("rate_per_sec"), ast.InternedTerm(in.Plan.RatePerSec)),
		))),
		ast.Item(ast.InternedTerm("active_sessions"), ast.InternedTerm(in.Active)),
	)
}
