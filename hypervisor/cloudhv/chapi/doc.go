// Package chapi speaks to one Cloud Hypervisor VMM: a typed client for its REST API on the
// Unix socket given by --api-socket (Client), and a decoder of the stream it writes to
// --event-monitor (EventDecoder).
//
// The types mirror the schemas of ../chspec/cloud-hypervisor.yaml (same names, same JSON
// names) and hold only the fields wb sets or reads plus every required one; fields the
// server adds are ignored. Where the real server differs from the document (the
// deviations chspec allows), the client follows the server: errors come as 400, 404, 409,
// 429 or 500 with a JSON array of strings, the server's error chain, which APIError keeps;
// PUT /vmm.shutdown answers 200, or nothing at all when the VMM exits first.
//
// Everything the VMM sends is untrusted input: answers are read up to 1 MiB and events up
// to 64 KiB, and neither can make the decoder hold more.
//
// The client's contract tests run every request it sends and every answer it parses
// through chspec's checker, so the client cannot drift from the document unnoticed.
package chapi
