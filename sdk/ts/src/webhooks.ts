// Standard Webhooks verification of wb's deliveries.
import { createHmac, timingSafeEqual } from "node:crypto";
import { toCamel } from "./case.js";

/** How far a delivery's webhook-timestamp may be from now, either way, in seconds. */
export const webhookToleranceS = 300;

/** Every refusal of verify. */
export class WebhookVerificationError extends Error {
  override readonly name = "WebhookVerificationError";
}

/** The body of a delivery. */
export interface WebhookEvent {
  /** evt_…, also the webhook-id header: deduplicate on it. */
  id: string;
  type: string;
  createdAt: string;
  data: {
    /** The session, snapshot or run, camelCased. */
    object: Record<string, unknown>;
    reason?: string;
    rule?: string;
  };
}

/** A request's headers: a fetch Headers, or Node's IncomingHttpHeaders (lower-case names). */
export type WebhookHeaders = Headers | Record<string, string | string[] | undefined>;

function header(h: WebhookHeaders, name: string): string {
  if (h instanceof Headers) {
    return h.get(name) ?? "";
  }
  for (const [k, v] of Object.entries(h)) {
    if (k.toLowerCase() === name) {
      return Array.isArray(v) ? v.join(" ") : (v ?? "");
    }
  }
  return "";
}

/**
 * Checks a delivery's Standard Webhooks signature (webhook-id, webhook-timestamp,
 * webhook-signature: space-separated "v1,<base64 HMAC-SHA256>") with the endpoint's whsec_
 * secret, refuses a timestamp more than five minutes from now, and answers the event. payload
 * must be the body's bytes as received (not re-encoded JSON).
 */
export function verifyWebhook(
  payload: string | Uint8Array,
  headers: WebhookHeaders,
  secret: string,
  at: { nowS?: number; toleranceS?: number } = {},
): WebhookEvent {
  const key = Buffer.from(secret.replace(/^whsec_/, ""), "base64");
  if (key.length === 0 || !/^[A-Za-z0-9+/]+={0,2}$/.test(secret.replace(/^whsec_/, ""))) {
    throw new WebhookVerificationError("webhook secret: want the endpoint's whsec_<base64> secret");
  }
  const id = header(headers, "webhook-id");
  const ts = header(headers, "webhook-timestamp");
  const sigs = header(headers, "webhook-signature");
  if (!id || !ts || !sigs) {
    throw new WebhookVerificationError("headers webhook-id, webhook-timestamp and webhook-signature are all required");
  }
  if (!/^\d+$/.test(ts)) {
    throw new WebhookVerificationError(`header webhook-timestamp ${JSON.stringify(ts)}: want Unix seconds`);
  }
  const nowS = at.nowS ?? Math.floor(Date.now() / 1000);
  const toleranceS = at.toleranceS ?? webhookToleranceS;
  const skew = nowS - Number(ts);
  if (Math.abs(skew) > toleranceS) {
    throw new WebhookVerificationError(
      `header webhook-timestamp is ${skew} s from now, more than the ${toleranceS} s allowed`,
    );
  }
  const body = typeof payload === "string" ? Buffer.from(payload, "utf8") : Buffer.from(payload);
  const want = createHmac("sha256", key).update(`${id}.${ts}.`).update(body).digest();
  const matched = sigs.split(/\s+/).some((s) => {
    const comma = s.indexOf(",");
    if (comma < 0 || s.slice(0, comma) !== "v1") {
      return false; // another scheme: not ours to check
    }
    const got = Buffer.from(s.slice(comma + 1), "base64");
    return got.length === want.length && timingSafeEqual(got, want);
  });
  if (!matched) {
    throw new WebhookVerificationError("no v1 signature in webhook-signature matches the body with this secret");
  }
  let ev: unknown;
  try {
    ev = JSON.parse(body.toString("utf8"));
  } catch (e) {
    throw new WebhookVerificationError("webhook body is not JSON", { cause: e });
  }
  return toCamel(ev) as WebhookEvent;
}
