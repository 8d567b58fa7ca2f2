// Package guest owns what runs inside a desktop's guest (template tpl_desktop): it starts the
// X display (Xvfb), the window manager and Chromium, takes screenshots of the display, and
// runs JavaScript in the browser in a fresh browser context per call. It acts only through an
// Execer (a session exec), so it works the same on any back end.
//
// Everything the guest answers is treated as hostile: sizes are bounded before decoding, and
// the screenshot decoder (XWD → PNG, on the host) is fuzzed. The DevTools client runs inside
// the guest (`wb agent cdp-eval`, EvalMain), since the guest has no network: Chromium runs
// under `wb agent cdp-relay` (RelayMain), which serves its DevTools pipe on an abstract Unix
// socket, not on TCP, so that a running desktop can be checkpointed by gVisor (its sleep).
// Between calls the relay keeps a spare browser context whose renderer already answers, so a
// call does not wait for a new renderer (seconds under gVisor).
package guest
