// Package quota owns money and limits on top of Redis: per-project rate limits now; the usage
// ledger and its settler, prices, spend counters and caps as the metering issue lands.
package quota
