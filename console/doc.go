// Package console is wb's web console, served at /console: plain HTML, CSS and a little
// JavaScript, embedded in the binary (no build step). It owns the pages and nothing else:
// the browser calls the public API (/v1/...) with the API key the user signs in with, kept
// in the tab's sessionStorage, so the console can do exactly what that key can and no more.
//
// Pages: index.html (sign in; the project's desktops and sessions with their states and
// costs), desktop.html?id=desk_... (one desktop: its live screen, its state, Sleep, Wake,
// Stop, Start, Resize). While the desktop page is visible it sends the desktop's heartbeat
// (POST /v1/desktops/{id}/heartbeat) every 20 s, and for one minute after it is hidden (seed
// 001, "What counts as use"); the query parameters heartbeat_ms, hidden_grace_ms and
// screen_ms change those periods, for tests.
package console
