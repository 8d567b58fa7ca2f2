// Command requiremeta is a wb plugin that requires metadata keys on a create request
// (admission point; other points are allowed). An empty value counts as missing.
//
// Configuration:
//   - "required": keys separated by ",". Default "team,cost_center".
//   - "defaults": KEY=VALUE pairs separated by ",". A missing required key that has a default
//     is filled by a patch {"metadata": {KEY: VALUE}} (a merge patch: other keys are kept) with
//     a warning; the request is denied only for missing keys without a default, naming them.
package main
