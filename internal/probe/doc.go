// Package probe polls something that is starting (a guest's agent, a VMM's API) until it
// answers, each probe bounded in time, the bound growing after a probe that ran out of it.
package probe
