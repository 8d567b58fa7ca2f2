package policies

import (
	"fmt"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Go's RSA code takes time quadratic in a key's modulus to load it (Montgomery constants,
// the key's consistency checks), and more to use it, with no bound on the modulus's size and
// no look at the evaluation's deadline: a key of a million bits, 175 KiB of PEM a policy can
// build at run time, held one call for 15 s. The builtins that load keys or certificates are
// therefore given at most maxKeyWork of key material: a modulus lies within one run of
// base64 text (PEM, base64-encoded PEM or DER, a JWK's "n"), so the squares of the runs'
// lengths bound the work. That allows a 16,384-bit RSA private key, or a bundle of a few
// dozen certificates, and about a fifth of a second of work.

// maxKeyWork bounds the sum of the squares of the lengths of the base64 runs a key builtin's
// key operands hold.
const maxKeyWork = (24 << 10) * (24 << 10)

// keyMaterial checks the strings in operands idx (at any depth) as keys.
func keyMaterial(idx ...int) sizeFunc {
	return func(ops []*ast.Term, _ int64, stop func() bool) (int64, error) {
		var work int64
		for _, i := range idx {
			if i >= len(ops) {
				continue
			}
			ast.WalkTerms(ops[i], func(t *ast.Term) bool {
				if s, ok := t.Value.(ast.String); ok {
					work += keyRuns(string(s))
				}
				return work > maxKeyWork
			})
		}
		if work > maxKeyWork {
			return 0, fmt.Errorf("the keys or certificates are too large (base64 runs of at most %d bytes together, counting their squares): use smaller keys or fewer certificates", 24<<10)
		}
		return 0, nil
	}
}

// keyRuns answers the sum of the squares of the lengths of s's runs of base64 or base64url
// text, with the PEM armour and the white space decoders skip.
func keyRuns(s string) int64 {
	var sum, run int64
	for i := range len(s) {
		c := s[i]
		if c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' ||
			c == '+' || c == '/' || c == '=' || c == '-' || c == '_' || c == ' ' || c == '\t' || c == '\r' || c == '\n' {
			run++
			continue
		}
		sum, run = sum+run*run, 0
	}
	return sum + run*run
}
