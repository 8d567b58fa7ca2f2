// Command allowlist is a wb plugin that denies templates that are not on an allowlist for the
// end user of a create request (admission point; other points are allowed).
//
// Configuration key "allowlist": entries separated by ";", each END_USER=TEMPLATE,TEMPLATE…
// where END_USER "*" applies to every end user without an entry of their own and to requests
// without an end_user_id. Without the key the built-in list allows the platform's two
// templates to everyone. A template is matched by its name; a pinned "name@sha256:…" counts
// as its name.
//
//	allowlist = "alice=tpl_dev_polyglot;bob=tpl_base;*=tpl_base"
package main
