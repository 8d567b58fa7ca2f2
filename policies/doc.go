// Package policies holds the platform's Rego (admission, runtime, spend) and the OPA engine
// that evaluates it at each decision point, with versioned uploads and modes
// enforce | warn | dryrun.
package policies
