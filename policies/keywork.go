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

// keyRuns answers the sum of the squares of the lengths of s's runs of base64 text, and of
// its runs of base64url text, each with the white space its decoders skip (PEM's spaces and
// tabs, line breaks). A key's encoding lies within one run of one of them, and a PEM
// bundle's armour ("-----BEGIN CERTIFICATE-----") ends a base64 run, so that each
// certificate counts alone (as one run of both alphabets, a bundle of 16 CA certificates was
// refused).
func keyRuns(s string) int64 {
	var sum, std, url int64
	for i := range len(s) {
		c := s[i]
		alnum := c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '=' || c == '\r' || c == '\n'
		if alnum || c == '+' || c == '/' || c == ' ' || c == '\t' {
			std++
		} else {
			sum, std = sum+runWork(std), 0
		}
		if alnum || c == '-' || c == '_' {
			url++
		} else {
			sum, url = sum+runWork(url), 0
		}
	}
	return sum + runWork(std) + runWork(url)
}

// runWork is a run's square, at least minKeyRun's for a run: each key of a set is parsed and
// tried in turn, whatever its size (32,768 P-256 keys, each a dozen short runs, held
// io.jwt.verify_es256 for 0.66 s and 100 MiB).
func runWork(n int64) int64 {
	if n == 0 {
		return 0
	}
	return max(n, minKeyRun) * max(n, minKeyRun)
}

// minKeyRun is the least length a run counts for.
const minKeyRun = 64
