// Package conformance holds black-box tests of the whole contract against any running
// deployment named by WB_URL and WB_API_KEY. It imports no internal package.
package conformance
