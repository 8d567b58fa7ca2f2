// Package testwait holds the tests' one way to wait on a condition: poll it until it holds,
// and fail the test, naming what it waited for, when it does not within the limit. Tests
// wait on conditions, never on fixed sleeps, so a slow machine takes longer but passes.
// Parallel is how a package whose tests mostly wait runs more of them at once than it has
// cores.
package testwait
