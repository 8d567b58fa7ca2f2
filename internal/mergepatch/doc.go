// Package mergepatch is the one implementation of JSON merge patch (RFC 7386) in wb: Apply
// applies a patch to a document, Compose folds two patches into one. Values are what
// encoding/json decodes into an any: map[string]any, []any, string, float64, bool, nil.
//
// The admission point uses both: each decider's patch is composed, in order, into the one
// patch its decision carries (Compose keeps nulls, so a later decider's null still removes the
// field), and the gateway applies that patch to the create request.
//
// No maintained merge-patch library is available to this module, so this is small on purpose;
// its test holds every example of RFC 7386 Appendix A and checks Compose against applying the
// patches one after another on random documents.
package mergepatch
