// Command hostile misbehaves on request, for the host's tests. The request's template picks
// the behaviour; any other template is allowed, with the config value of "echo" (if set) as a
// warning.
package main
