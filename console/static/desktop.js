// One desktop: its state (polled), its live screen (a PNG from GET /v1/desktops/{id}/screen,
// refreshed while the page is visible and the desktop runs), its buttons, and the heartbeat.
//
// The heartbeat is what keeps the desktop awake while someone looks at it (seed 001, "What
// counts as use": its screen open in a visible tab, but not a background tab after one
// minute). While the page is visible it is sent every heartbeat_ms; once hidden it goes on
// for hidden_grace_ms, then stops; visible again, it is sent at once and resumes. It never
// wakes a desktop: only the Wake and Start buttons do.
"use strict";

(() => {
  const id = new URLSearchParams(location.search).get("id") || "";
  const path = "/v1/desktops/" + encodeURIComponent(id);
  const pollMs = 2000;
  let heartbeatMs, graceMs, screenMs;
  let desktop = null;
  let beatTimer = null, graceTimer = null, screenTimer = null;
  let screenURL = null, screenBusy = false;
  // A size chosen and not yet sent: the poll leaves the choice alone (it reset a choice made
  // just before the Resize click, which then sent the current size).
  let sizeChosen = false;

  const $ = (sel) => document.getElementById(sel);

  // Which buttons the seed's transitions allow from each state.
  const allowed = {
    sleep: ["running"],
    wake: ["asleep"],
    stop: ["running", "starting", "asleep"],
    start: ["stopped", "failed"],
  };

  function show(d) {
    desktop = d;
    document.title = d.name + " · wb console";
    $("name").textContent = d.name;
    $("desktop-id").textContent = d.id;
    $("size").textContent = d.size;
    $("next-size").textContent = d.next_size ? " (" + d.next_size + " from its next start)" : "";
    wb.stateBadge($("state"), d.state);
    if (d.state === "asleep" && !d.state_saved) $("state").textContent = "asleep: state not saved";
    document.body.dataset.state = d.state;
    $("message").textContent = d.message || "";
    for (const [action, states] of Object.entries(allowed)) $(action).disabled = !states.includes(d.state);
    if (!sizeChosen && document.activeElement !== $("new-size")) $("new-size").value = d.next_size || d.size;
    if (d.state !== "running") {
      $("screen").hidden = true;
      $("screen-note").textContent = "No screen: the desktop is " + $("state").textContent + ".";
    } else if (!screenTimer && !screenBusy) {
      refreshScreen();
    }
  }

  async function load() {
    try {
      show(await wb.call("GET", path));
    } catch (err) {
      if (!wb.onAuthError(err)) wb.showError(err);
    }
  }

  async function act(action) {
    wb.showError(null);
    try {
      show(await wb.call("POST", path + ":" + action, { body: {} }));
    } catch (err) {
      if (!wb.onAuthError(err)) wb.showError(err);
    }
  }

  async function resize() {
    wb.showError(null);
    try {
      const d = await wb.call("PATCH", path, { body: { size: $("new-size").value } });
      sizeChosen = false;
      show(d);
    } catch (err) {
      if (!wb.onAuthError(err)) wb.showError(err);
    }
  }

  // The screen: fetched with the key (an <img> cannot send it) and shown as a blob: URL;
  // the next one is asked for screenMs after this one arrived, only while visible and running.
  async function refreshScreen() {
    clearTimeout(screenTimer);
    screenTimer = null;
    if (document.visibilityState !== "visible" || !desktop || desktop.state !== "running") return;
    screenBusy = true;
    try {
      const resp = await wb.call("GET", path + "/screen", { raw: true });
      const url = URL.createObjectURL(await resp.blob());
      $("screen").src = url;
      $("screen").hidden = false;
      if (screenURL) URL.revokeObjectURL(screenURL);
      screenURL = url;
      $("screen-note").textContent = "Live screen, updated " + new Date().toLocaleTimeString() + ".";
      document.body.dataset.screens = String(Number(document.body.dataset.screens || 0) + 1);
    } catch (err) {
      if (wb.onAuthError(err)) return;
      $("screen-note").textContent = "No screen: " + err.message;
    } finally {
      screenBusy = false;
    }
    if (document.visibilityState === "visible" && desktop && desktop.state === "running") {
      screenTimer = setTimeout(refreshScreen, screenMs);
    }
  }

  async function beat() {
    document.body.dataset.heartbeats = String(Number(document.body.dataset.heartbeats) + 1);
    try {
      show(await wb.call("POST", path + "/heartbeat", { body: {} }));
    } catch (err) {
      if (!wb.onAuthError(err)) wb.showError(err);
    }
  }

  function startBeats() {
    clearTimeout(graceTimer);
    graceTimer = null;
    clearInterval(beatTimer);
    document.body.dataset.heartbeat = "on";
    beat();
    beatTimer = setInterval(beat, heartbeatMs);
  }

  function stopBeats() {
    clearInterval(beatTimer);
    beatTimer = null;
    document.body.dataset.heartbeat = "off";
  }

  function onVisibility() {
    if (document.visibilityState === "visible") {
      startBeats();
      refreshScreen();
      return;
    }
    // Hidden: the heartbeat goes on for the grace, then stops (a background tab is no use
    // after it); the screen stops at once.
    clearTimeout(screenTimer);
    screenTimer = null;
    clearTimeout(graceTimer);
    graceTimer = setTimeout(stopBeats, graceMs);
  }

  document.addEventListener("DOMContentLoaded", () => {
    if (!wb.key()) {
      location.href = "./";
      return;
    }
    heartbeatMs = wb.setting("heartbeat_ms", "heartbeatMs");
    graceMs = wb.setting("hidden_grace_ms", "hiddenGraceMs");
    screenMs = wb.setting("screen_ms", "screenMs");
    for (const action of Object.keys(allowed)) $(action).addEventListener("click", () => act(action));
    $("resize").addEventListener("click", resize);
    $("new-size").addEventListener("change", () => { sizeChosen = true; });
    document.addEventListener("visibilitychange", onVisibility);
    load();
    setInterval(load, pollMs);
    if (document.visibilityState === "visible") startBeats();
    else onVisibility();
  });
})();
