// What every page of the console shares: the API key of this tab, calls to the public API
// with it, and the formatting of states, durations and money. Nothing here talks to anything
// but this server's /v1 API.
"use strict";

const wb = (() => {
  const keyName = "wb_api_key";

  // APIError is an answer of the API that was not a success: its message is the API's own.
  class APIError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  function key() { return sessionStorage.getItem(keyName) || ""; }
  function setKey(k) { sessionStorage.setItem(keyName, k); }

  function signOut() {
    sessionStorage.removeItem(keyName);
    location.href = "./";
  }

  // call sends one request to the API with the tab's key and answers the parsed JSON, the
  // raw Response when raw is set, or throws an APIError carrying the API's message.
  async function call(method, path, { body, raw, apiKey } = {}) {
    const headers = { "Authorization": "Bearer " + (apiKey || key()) };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let resp;
    try {
      resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), cache: "no-store" });
    } catch (e) {
      throw new APIError(0, "network", "the server did not answer: " + e.message);
    }
    if (!resp.ok) {
      let code = "http_" + resp.status, message = resp.status + " " + resp.statusText;
      try {
        const e = (await resp.json()).error;
        if (e && e.message) { code = e.code; message = e.message; }
      } catch (_) { /* not the API's error body: keep the status line */ }
      throw new APIError(resp.status, code, message);
    }
    if (raw) return resp;
    return resp.status === 204 ? null : resp.json();
  }

  function showError(err) {
    const el = document.getElementById("error");
    if (!el) return;
    if (!err) { el.hidden = true; el.textContent = ""; return; }
    el.textContent = err.message || String(err);
    el.hidden = false;
  }

  // A 401 means the key is gone or wrong: back to the sign-in form.
  function onAuthError(err) {
    if (err instanceof APIError && err.status === 401) {
      signOut();
      return true;
    }
    return false;
  }

  function money(microUSD) {
    if (microUSD == null) return "–";
    return "$" + (microUSD / 1e6).toFixed(microUSD < 10000 ? 6 : 4);
  }

  function duration(s) {
    if (s == null) return "–";
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
  }

  function when(t) {
    if (!t) return "–";
    const d = new Date(t);
    return isNaN(d) ? t : d.toLocaleString();
  }

  function stateBadge(el, state) {
    el.textContent = state;
    el.className = "state " + state;
  }

  // param reads a positive number from the page's query, else its body's data attribute.
  function setting(query, data) {
    const q = Number(new URLSearchParams(location.search).get(query));
    if (q > 0) return q;
    return Number(document.body.dataset[data]);
  }

  document.addEventListener("DOMContentLoaded", () => {
    const out = document.getElementById("signout");
    if (out) out.addEventListener("click", signOut);
  });

  return { APIError, key, setKey, signOut, call, showError, onAuthError, money, duration, when, stateBadge, setting };
})();
