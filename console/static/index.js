// The first page: the sign-in form, then the project's desktops and sessions with their
// states and costs, refreshed every few seconds. Listing is not a use: it keeps no desktop
// awake.
"use strict";

(() => {
  const refreshMs = 5000;
  // The metadata key the platform sets on a desktop's sessions (session.DesktopMetadataKey).
  const deskKey = "wb.desktop_id";
  let timer = null;

  function cell(row, text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    row.appendChild(td);
    return td;
  }

  // costs answers this month's settled cost of each session and of each desktop, from GET
  // /v1/usage. A desktop runs as a new session at each start or wake; the report names the
  // desktop on each of those sessions' lines (also once the session is no longer listed), so
  // its cost is their sum.
  async function costs() {
    const rep = await wb.call("GET", "/v1/usage?group_by=session");
    const bySession = new Map();
    const byDesktop = new Map();
    for (const line of rep.data || []) {
      bySession.set(line.session_id, line.cost_micro_usd);
      if (line.desktop_id) byDesktop.set(line.desktop_id, (byDesktop.get(line.desktop_id) || 0) + line.cost_micro_usd);
    }
    document.getElementById("totals").textContent =
      "This month: " + wb.money(rep.totals.cost_micro_usd) + " for " + wb.duration(rep.totals.session_s) + " of sessions (settled; the last few seconds arrive shortly).";
    return { bySession, byDesktop };
  }

  function renderDesktops(list, cost) {
    const body = document.querySelector("#desktops tbody");
    body.replaceChildren();
    for (const d of list) {
      const row = document.createElement("tr");
      row.dataset.id = d.id;
      const name = document.createElement("a");
      name.href = "desktop.html?id=" + encodeURIComponent(d.id);
      name.textContent = d.name;
      name.className = "open";
      cell(row, "").appendChild(name);
      cell(row, d.id);
      const st = cell(row, "");
      const badge = document.createElement("span");
      wb.stateBadge(badge, d.state === "asleep" && !d.state_saved ? "asleep" : d.state);
      if (d.state === "asleep" && !d.state_saved) badge.textContent = "asleep: state not saved";
      st.appendChild(badge);
      cell(row, d.size + (d.next_size ? " → " + d.next_size : ""));
      cell(row, wb.when(d.last_used_at));
      const spent = cost.byDesktop.get(d.id) || 0;
      cell(row, wb.money(spent), "num cost").dataset.microUsd = String(spent);
      body.appendChild(row);
    }
    document.getElementById("desktops-empty").hidden = list.length > 0;
  }

  // renderSessions lists the sessions; a desktop's (its metadata names it) says so.
  function renderSessions(list, cost, desktopName) {
    const body = document.querySelector("#sessions tbody");
    body.replaceChildren();
    for (const s of list) {
      const row = document.createElement("tr");
      row.dataset.id = s.id;
      const desk = s.metadata && s.metadata[deskKey];
      cell(row, desk ? s.id + " (desktop " + (desktopName.get(desk) || desk) + ")" : s.id);
      const badge = document.createElement("span");
      wb.stateBadge(badge, s.state);
      cell(row, "").appendChild(badge);
      cell(row, String(s.tier));
      cell(row, s.resources ? s.resources.size_class : "–");
      cell(row, (s.template || "").split("@")[0]);
      cell(row, wb.duration(s.usage_to_date ? s.usage_to_date.session_s : null), "num");
      cell(row, s.usage_to_date ? (s.usage_to_date.cpu_ms / 1000).toFixed(1) + " s" : "–", "num");
      cell(row, wb.money(cost.bySession.get(s.id) || 0), "num");
      body.appendChild(row);
    }
    document.getElementById("sessions-empty").hidden = list.length > 0;
  }

  async function refresh() {
    try {
      const [desktops, sessions, cost] = await Promise.all([
        wb.call("GET", "/v1/desktops?limit=100"),
        wb.call("GET", "/v1/sessions?limit=100"),
        costs(),
      ]);
      renderDesktops(desktops.data, cost);
      renderSessions(sessions.data, cost, new Map(desktops.data.map((d) => [d.id, d.name])));
      document.body.dataset.loaded = "true";
      wb.showError(null);
    } catch (err) {
      if (!wb.onAuthError(err)) wb.showError(err);
    }
  }

  function showOverview() {
    document.getElementById("signin").hidden = true;
    document.getElementById("overview").hidden = false;
    document.getElementById("signout").hidden = false;
    refresh();
    timer = setInterval(refresh, refreshMs);
  }

  document.addEventListener("DOMContentLoaded", () => {
    const form = document.getElementById("signin");
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const k = document.getElementById("key").value.trim();
      try {
        // Any authenticated call tells whether the key is good.
        await wb.call("GET", "/v1/desktops?limit=1", { apiKey: k });
      } catch (err) {
        wb.showError(err);
        return;
      }
      wb.setKey(k);
      wb.showError(null);
      showOverview();
    });
    if (wb.key()) showOverview();
    else form.hidden = false;
  });
})();
