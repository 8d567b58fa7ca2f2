// Command tiercap is a wb plugin that caps the tier of a create request by the prefix of its
// end_user_id (admission point; other points are allowed).
//
// Configuration:
//   - "caps": PREFIX=TIER pairs separated by ",", the longest matching prefix wins. Default
//     "free_=1,trial_=2". End users matching no prefix are not capped.
//   - "mode": "patch" (default) lowers the tier with a patch {"tier": CAP} and a warning, so the
//     session is still created; "deny" refuses the request instead.
package main
