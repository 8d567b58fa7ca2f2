// Package quota owns money and limits on top of Redis:
//
//   - rate limits: a token bucket per project, shared by every gateway (RateLimiter);
//   - prices: the table of quota/PRICES.md, in micro-USD (Prices, LoadPrices);
//   - usage: the records nodes write to each project's usage stream (Record), settled exactly
//     once by the Settler into the session's usage_to_date, hourly cost buckets and monthly
//     spend counters, with snapshot storage accrued beside them. The Settler works from
//     events: it waits on the usage signals (store.WorkUsage), settles one project at a time
//     under its settlement lock, accrues only projects that have snapshots, and walks every
//     project once at start and every few minutes for signals lost to a crash, pruning then
//     what no reader needs any more (seqs past the replay window, old hourly and daily spend
//     fields, monthly ones once no usage report can reach their month);
//   - caps: a project's and its end users' monthly spend caps (Limits), watched on settled
//     spend (Caps) and acted on by the Enforcer, which asks the spend decision point, stops
//     the sessions in scope and sends quota.exceeded once; a stop its passes left unfinished
//     is held, and the settler carries it on every few seconds (Enforcer.RetryStops). A
//     crossing is decided at least once (again, when its decision's end was not recorded):
//     its quota.exceeded then has the same id, derived from the crossing (capEventID), which
//     receivers deduplicate on;
//   - reports: GET /v1/usage, summed from the hourly buckets (BuildReport).
package quota
