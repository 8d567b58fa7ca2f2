// Package conformance holds black-box tests of the whole contract against a deployment named
// by WB_URL and WB_API_KEY or, without them, against two `wb serve` it builds and starts on
// this machine (runsc and runc), each with a data directory of its own. It imports no wb
// package but wb/session.
package conformance
