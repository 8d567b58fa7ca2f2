// Webhook verification against the vectors of the Go side: the first is Standard Webhooks'
// own example, the second an event signed by wb's webhooks.Sign (package webhooks), and the
// refusals are the Go SDK's cases (client/webhook_test.go).
import assert from "node:assert/strict";
import { test } from "node:test";
import { verifyWebhook, WebhookVerificationError, Wb } from "../src/index.js";

const spec = {
  secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
  id: "msg_p5jXN8AQM9LWM0D4loKWxJek",
  ts: 1614265330,
  body: '{"test": 2432232314}',
  signature: "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
};

const wbEvent = {
  secret: "whsec_c2VjcmV0LWtleS1vZi10aGUtd2Itc2RrLXRlc3Rz",
  id: "evt_1",
  ts: 1767225600,
  body: '{"id":"evt_1","type":"session.running","created_at":"2026-01-01T00:00:00.000Z","data":{"object":{"id":"sess_1","idle_timeout_s":300}}}',
  signature: "v1,jbWlh3v0CmsztcJWVuXyqAbZtCVVkPP7AzV79pYq5b8=",
};

function headers(v: { id: string; ts: number; signature: string }): Record<string, string> {
  return { "webhook-id": v.id, "webhook-timestamp": String(v.ts), "webhook-signature": v.signature };
}

test("the Standard Webhooks example verifies", () => {
  const ev = verifyWebhook(spec.body, headers(spec), spec.secret, { nowS: spec.ts });
  assert.deepEqual(ev, { test: 2432232314 });
});

test("an event signed by wb's webhooks.Sign verifies and reads in camelCase", () => {
  const wb = new Wb({ url: "http://127.0.0.1:1", apiKey: "k" });
  for (const h of [headers(wbEvent), new Headers(headers(wbEvent)), { "Webhook-Id": wbEvent.id, "webhook-timestamp": [String(wbEvent.ts)], "webhook-signature": wbEvent.signature }]) {
    const ev = wb.webhooks.verify(Buffer.from(wbEvent.body), h, wbEvent.secret, { nowS: wbEvent.ts + 10 });
    assert.equal(ev.id, "evt_1");
    assert.equal(ev.type, "session.running");
    assert.equal(ev.createdAt, "2026-01-01T00:00:00.000Z");
    assert.deepEqual(ev.data.object, { id: "sess_1", idleTimeoutS: 300 });
  }
});

test("one good signature among several suffices", () => {
  const h = headers(wbEvent);
  h["webhook-signature"] = "v1,AAAA v2,xyz " + wbEvent.signature;
  verifyWebhook(wbEvent.body, h, wbEvent.secret, { nowS: wbEvent.ts });
});

test("refusals: changed body, another secret or id, stale or future, missing header, not a secret", () => {
  const at = { nowS: wbEvent.ts };
  const cases: Record<string, [string, Record<string, string>, string, { nowS: number }]> = {
    "changed body": [wbEvent.body.replace("}}}", "}} }"), headers(wbEvent), wbEvent.secret, at],
    "another secret": [wbEvent.body, headers(wbEvent), spec.secret, at],
    "another id": [wbEvent.body, { ...headers(wbEvent), "webhook-id": "evt_2" }, wbEvent.secret, at],
    "stale timestamp": [wbEvent.body, headers(wbEvent), wbEvent.secret, { nowS: wbEvent.ts + 600 }],
    "future timestamp": [wbEvent.body, headers(wbEvent), wbEvent.secret, { nowS: wbEvent.ts - 600 }],
    "missing id": [wbEvent.body, { ...headers(wbEvent), "webhook-id": "" }, wbEvent.secret, at],
    "not a secret": [wbEvent.body, headers(wbEvent), "whsec_%%%", at],
    "timestamp not seconds": [wbEvent.body, { ...headers(wbEvent), "webhook-timestamp": "1e9" }, wbEvent.secret, at],
  };
  for (const [name, [body, h, secret, when]] of Object.entries(cases)) {
    assert.throws(() => verifyWebhook(body, h, secret, when), WebhookVerificationError, name);
  }
});
