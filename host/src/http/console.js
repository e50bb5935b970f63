"use strict";
// The console is a client of the public HTTP API (docs/http-api.md), with
// the token the user enters (kept in this browser's localStorage).
const $ = (sel, root = document) => root.querySelector(sel);
const h = (tag, attrs = {}, ...children) => {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null) el.setAttribute(k, v);
  }
  for (const c of children.flat()) el.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return el;
};
const json = (v) => JSON.stringify(v);
const pretty = (v) => JSON.stringify(v, null, 2);
const settings = {
  get project() { return localStorage.getItem("streamhost.project") ?? "acme"; },
  get token() { return localStorage.getItem("streamhost.token") ?? ""; },
};
for (const id of ["project", "token"]) {
  const input = $("#" + id);
  input.value = settings[id];
  input.addEventListener("change", () => { localStorage.setItem("streamhost." + id, input.value.trim()); route(); });
}
// Where the API is: this page's path without "/console" (the API may be
// mounted under a prefix inside another application).
const apiBase = location.pathname.replace(/\/console\/?$/, "");
const namespace = () => settings.project ? `/v1/projects/${encodeURIComponent(settings.project)}` : "/v1/global";
const streamUrl = (path) => `${namespace()}/streams${path === "/" ? "/" : path}`;
const headers = (extra = {}) => Object.assign(settings.token ? { authorization: `Bearer ${settings.token}` } : {}, extra);

function showError(e) {
  const box = $("#error");
  if (!e) { box.style.display = "none"; return; }
  box.textContent = String(e.message ?? e);
  box.style.display = "block";
}

async function api(method, path, body) {
  const response = await fetch(apiBase + path, {
    method,
    headers: headers(body === undefined ? {} : { "content-type": "application/json" }),
    body: body === undefined ? undefined : json(body),
  });
  const text = await response.text();
  let value = null;
  try { value = text ? JSON.parse(text) : null; } catch { value = text; }
  if (!response.ok) {
    const err = value?.error;
    throw new Error(err ? `${response.status} ${err.code}: ${err.message}` : `${response.status} ${text}`);
  }
  return value;
}

function setActive(name) {
  for (const a of document.querySelectorAll("header a")) a.classList.toggle("active", a.dataset.nav === name);
}

// --- Streams --------------------------------------------------------------
async function streamsView(params) {
  setActive("streams");
  const prefix = params.get("prefix") || "/";
  const input = h("input", { value: prefix, "data-testid": "prefix", size: 30 });
  const go = () => { location.hash = `#/streams?prefix=${encodeURIComponent(input.value || "/")}`; };
  input.addEventListener("keydown", (e) => { if (e.key === "Enter") go(); });
  const attention = h("div", { "data-testid": "attention" });
  const body = h("tbody");
  // What needs someone comes first: halted, then failing subscriptions.
  $("#view").replaceChildren(
    h("h2", {}, "Streams"),
    attention,
    h("div", { class: "toolbar" }, "path prefix", input, h("button", { onclick: go }, "Filter")),
    h("table", { "data-testid": "streams" },
      h("thead", {}, h("tr", {}, ["path", "health", "events", "max offset", "subscriptions", "paused", "created"].map((c) => h("th", {}, c)))),
      body));
  const [page, detail] = await Promise.all([
    api("GET", `${namespace()}/streams?prefix=${encodeURIComponent(prefix)}&limit=1000`),
    api("GET", "/healthz?detail=true").catch(() => null),
  ]);
  const mine = (p) => (p.project ?? "") === settings.project;
  const halted = (detail?.halted ?? []).filter(mine);
  const failing = (detail?.failing ?? []).filter(mine);
  const problems = new Map();
  for (const [kind, list] of [["halted", halted], ["failing", failing]]) {
    for (const p of list) {
      const seen = problems.get(p.stream) ?? { halted: 0, failing: 0 };
      seen[kind] += 1;
      problems.set(p.stream, seen);
    }
  }
  const problemLine = (kind, p) => h("li", { "data-testid": `attention-${kind}` },
    h("span", { class: "pill bad" }, kind), " ",
    h("a", { href: `#/stream?path=${encodeURIComponent(p.stream)}` }, p.stream), " ",
    h("code", {}, p.subscription), p.processor ? ` (processor ${p.processor})` : "",
    ` · ${p.attempts} attempt(s)`,
    p.lastError ? h("div", { class: "mono muted" }, p.lastError.split("\n")[0]) : "");
  if (halted.length || failing.length) {
    attention.replaceChildren(
      h("h3", { class: "bad" }, `Needs attention: ${halted.length} halted, ${failing.length} failing`),
      h("ul", {}, halted.map((p) => problemLine("halted", p)), failing.map((p) => problemLine("failing", p))),
      detail?.truncated ? h("p", { class: "muted" }, "(more than 100 of a kind: the rest are not listed)") : "");
  } else if (detail) {
    attention.replaceChildren(h("p", { class: "ok", "data-testid": "attention-none" }, "nothing halted or failing"));
  }
  // Streams that need someone first, then by path.
  const weight = (s) => { const p = problems.get(s.path); return p ? (p.halted ? 0 : 1) : 2; };
  const streams = [...page.streams].sort((a, b) => weight(a) - weight(b) || (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
  for (const s of streams) {
    const p = problems.get(s.path);
    body.append(h("tr", { "data-path": s.path, class: p ? "failing" : "" },
      h("td", {}, h("a", { href: `#/stream?path=${encodeURIComponent(s.path)}`, "data-testid": "stream-link" }, s.path)),
      h("td", {}, p ? h("span", { class: "pill bad" }, [p.halted ? `${p.halted} halted` : "", p.failing ? `${p.failing} failing` : ""].filter(Boolean).join(", ")) : ""),
      h("td", {}, s.eventCount), h("td", {}, s.maxOffset), h("td", {}, s.subscriptions),
      h("td", {}, s.paused ? h("span", { class: "pill bad" }, "paused") : ""),
      h("td", { class: "muted" }, s.createdAt)));
  }
  if (!page.streams.length) body.append(h("tr", {}, h("td", { colspan: 7, class: "muted" }, "no streams under this prefix")));
}

// --- One event's story ------------------------------------------------------
// `GET {stream}:events/{offset}/trace`: where the event came from and what
// it caused, across streams, from what storage holds.
function stepLine(step) {
  const parts = [step.kind];
  if (step.component) parts.push(step.component);
  if (step.effectKey) parts.push(JSON.stringify(step.effectKey));
  if (step.offset !== undefined) parts.push(h("a", { href: `#/trace?path=${encodeURIComponent(step.stream)}&offset=${step.offset}` }, `${step.stream}@${step.offset}`));
  if (step.type) parts.push(h("code", {}, step.type));
  if (step.subscriptionKey) parts.push(`(subscription ${step.subscriptionKey})`);
  if (step.target) parts.push(`→ ${step.target}`);
  const bad = ["halted", "failed", "dead"].includes(step.status) || Boolean(step.error);
  return h("span", { "data-kind": step.kind },
    parts.flatMap((p) => [p, " "]),
    h("span", { class: `pill ${bad ? "bad" : "ok"}` }, step.status),
    step.at ? h("span", { class: "muted" }, ` ${step.at}`) : "",
    step.error ? h("div", { class: "mono bad" }, step.error.split("\n")[0]) : "");
}

function stepTree(steps) {
  return h("ul", {}, steps.map((s) => h("li", {}, stepLine(s), s.caused?.length ? stepTree(s.caused) : "")));
}

async function traceView(params) {
  setActive("streams");
  const path = params.get("path") || "/";
  const offset = Number(params.get("offset"));
  const base = `${streamUrl(path)}:events/${offset}/trace`;
  const story = await api("GET", base);
  const exported = h("span", { class: "muted", "data-testid": "trace-exported" });
  const send = async () => {
    try { const out = await api("GET", `${base}?export=true`); exported.textContent = ` sent: ${out.exportedSpans} span(s)`; }
    catch (e) { showError(e); }
  };
  $("#view").replaceChildren(
    h("h2", {}, "Event ", h("code", {}, `${path}@${offset}`), " ",
      h("a", { href: `#/stream?path=${encodeURIComponent(path)}` }, "back to the stream")),
    h("div", { "data-testid": "trace" },
      story.traceId ? h("p", {}, "trace ", h("code", {}, story.traceId), " ",
        h("button", { onclick: send }, "Send to the OTLP endpoint"), exported) : h("p", { class: "muted" }, "no trace context"),
      story.upstream.length ? h("div", {}, h("h3", {}, "Came from"),
        h("ul", { "data-testid": "trace-upstream" }, [...story.upstream].reverse().map((s) => h("li", {}, stepLine(s))))) : "",
      h("h3", {}, "The event"), h("p", { "data-testid": "trace-event" }, stepLine(story.event)),
      h("h3", {}, "What it caused"),
      story.downstream.length ? h("div", { "data-testid": "trace-downstream" }, stepTree(story.downstream)) : h("p", { class: "muted" }, "nothing yet"),
      story.truncated ? h("p", { class: "muted" }, "(truncated: the story goes on past the bounds of depth 8 and 256 steps)") : ""));
}

// --- One stream -----------------------------------------------------------
const EVENTS_SHOWN = 200;
// Verify results survive the periodic refresh of the processors section.
const verdicts = new Map();
// Keys of a processor's keyed state shown with it.
const KEYS_SHOWN = 50;
// The offset each processor's time-travel slider was left at, and what it
// showed (the processors section is rebuilt on every refresh).
const timeTravel = new Map();

async function streamView(params) {
  setActive("streams");
  const path = params.get("path") || "/";
  const health = h("p", { "data-testid": "health", class: "health" });
  const events = h("tbody", { "data-testid": "events" });
  const state = h("pre", { "data-testid": "state" });
  const subs = h("tbody", { "data-testid": "subscriptions" });
  const procs = h("div", { "data-testid": "processors" });
  const effects = h("tbody", { "data-testid": "effects" });
  const head = h("span", { class: "muted" });
  // Health first (what is failing, how far behind), then the events.
  $("#view").replaceChildren(
    h("h2", {}, "Stream ", h("code", {}, path), " ", head),
    health,
    h("h3", {}, "Subscriptions"),
    h("table", {}, h("thead", {}, h("tr", {}, ["key", "receiver", "cursor", "lag", "attempt", "last error", "health", ""].map((c) => h("th", {}, c)))), subs),
    h("h3", {}, "Processors"), procs,
    h("div", { class: "grid" },
      h("div", {},
        h("h3", {}, "Events (newest first)"),
        h("table", {}, h("thead", {}, h("tr", {}, ["offset", "type", "payload", "created"].map((c) => h("th", {}, c)))), events)),
      h("div", {}, h("h3", {}, "Core state"), state)),
    h("h3", {}, "Effects"),
    h("table", {}, h("thead", {}, h("tr", {}, ["id", "component", "key", "target", "status", "due", "attempts", "last error", ""].map((c) => h("th", {}, c)))), effects));

  let refreshing = false;
  const refresh = async () => {
    if (refreshing) return;
    refreshing = true;
    try { await refreshDetails(path, { state, subs, procs, effects, head, health }); showError(null); }
    catch (e) { showError(e); }
    finally { refreshing = false; }
  };
  await refresh();
  // Events by reading pages (`:events`), not a live connection: a live
  // connection is recorded on the stream (connection-opened/-closed), and
  // looking at a stream must not change it.
  let after = Math.max(0, (Number(state.dataset.maxOffset) || 0) - EVENTS_SHOWN);
  let polling = false;
  const poll = async () => {
    if (polling) return;
    polling = true;
    try {
      let page;
      do {
        page = await api("GET", `${streamUrl(path)}:events?afterOffset=${after}&limit=500`);
        for (const e of page.events) {
          after = Math.max(after, e.offset);
          events.prepend(h("tr", { "data-offset": e.offset },
            h("td", {}, h("a", { href: `#/trace?path=${encodeURIComponent(path)}&offset=${e.offset}`, "data-testid": `trace-${e.offset}`, title: "where it came from and what it caused" }, e.offset)),
            h("td", { class: "mono" }, e.type),
            h("td", { class: "mono payload" }, json(e.payload)), h("td", { class: "muted" }, e.createdAt)));
        }
        while (events.children.length > EVENTS_SHOWN) events.lastChild.remove();
      } while (page.events.length === 500);
      if (page.events.length) refresh();
    } catch (e) { showError(e); }
    finally { polling = false; }
  };
  await poll();
  const eventsTimer = setInterval(() => { if (!document.hidden) poll(); }, 1000);
  // Runtime (cursors, lag, attempts) moves without events: look again now and then.
  const timer = setInterval(() => { if (!document.hidden) refresh(); }, 2000);
  cleanup = () => { clearInterval(timer); clearInterval(eventsTimer); };
}

function receiverText(receiver) {
  if (!receiver) return "";
  switch (receiver.action) {
    case "copy-to-stream": return `copy → ${receiver.receivingStreamPath}`;
    case "webhook-post": return `webhook → ${receiver.url}`;
    case "itx-call": return `itx ${json(receiver.expression)}`;
    case "processor-wake": return `wake ${receiver.expression?.[1]?.[1] ?? ""}`;
    default: return receiver.action;
  }
}

async function refreshDetails(path, ui) {
  const base = streamUrl(path);
  const [core, runtime] = await Promise.all([api("GET", `${base}:state`), api("GET", `${base}:runtime`)]);
  ui.state.textContent = pretty(core);
  ui.state.dataset.maxOffset = core.maxOffset;
  ui.head.textContent = `max offset ${core.maxOffset}${core.paused ? " · paused" : ""}`;
  const byKey = core.subscriptions?.outbound?.byKey ?? {};
  ui.subs.replaceChildren();
  const processors = [];
  let [halted, failingCount, lag] = [0, 0, 0];
  for (const [key, sub] of Object.entries(byKey)) {
    const receiver = sub.configuration?.receiver;
    const rt = runtime.subscriptions?.[key] ?? {};
    const halt = sub.deliveryHalted;
    if (receiver?.action === "processor-wake") processors.push(receiver.expression?.[1]?.[1]);
    // Failing: attempts failed, not halted yet (retrying after a backoff).
    const failing = !halt && rt.attempt > 0;
    if (halt) halted += 1;
    if (failing) failingCount += 1;
    lag += rt.lag ?? 0;
    const button = (label) => h("button", {
      "data-testid": `${label === "Resume" ? "resume" : "retry"}-${key}`,
      onclick: async () => {
        try { await api("POST", `${base}:resumeSubscription`, { subscriptionKey: key }); await refreshDetails(path, ui); }
        catch (e) { showError(e); }
      },
    }, label);
    const status = halt ? h("span", { class: "pill bad" }, `halted after offset ${halt.afterOffset}: ${halt.reason}`)
      : failing ? h("span", { class: "pill bad" }, `failing: attempt ${rt.attempt}` + (rt.nextAttemptAt ? `, next at ${new Date(rt.nextAttemptAt).toISOString()}` : ""))
        : h("span", { class: "pill ok" }, "delivering");
    ui.subs.append(h("tr", { "data-key": key, class: halt || failing ? "failing" : "" },
      h("td", { class: "mono" }, key), h("td", { class: "mono" }, receiverText(receiver)),
      h("td", { "data-testid": `cursor-${key}` }, rt.acknowledgedOffset ?? ""), h("td", {}, rt.lag ?? ""),
      h("td", {}, rt.attempt ?? ""), h("td", { class: "bad mono" }, rt.lastError ?? ""),
      h("td", { "data-testid": `halt-${key}` }, status),
      h("td", {}, halt ? button("Resume") : failing ? button("Retry now") : "")));
  }
  const total = Object.keys(byKey).length;
  ui.health.replaceChildren(
    h("span", {}, `${total} subscription${total === 1 ? "" : "s"}`), " · ",
    h("span", { class: failingCount ? "bad" : "ok", "data-testid": "failing-count" }, `${failingCount} failing`), " · ",
    h("span", { class: halted ? "bad" : "ok", "data-testid": "halted-count" }, `${halted} halted`), " · ",
    h("span", {}, `lag ${lag}`));
  if (!Object.keys(byKey).length) ui.subs.append(h("tr", {}, h("td", { colspan: 9, class: "muted" }, "no subscriptions")));

  // Built apart and put in place at the end: two refreshes that overlap
  // (the timer's and a button's) must not both append to the page.
  const procs = [];
  for (const component of processors.filter(Boolean)) {
    let p;
    try { p = await api("GET", `${base}:processors/${encodeURIComponent(component)}`); }
    catch (e) { procs.push(h("p", { class: "muted" }, `${component}: ${e.message}`)); continue; }
    const shown = verdicts.get(`${path} ${component}`);
    const verdict = h("span", { "data-testid": `verify-${component}`, class: shown?.cls ?? "" }, shown?.text ?? "");
    const remember = (text, cls) => {
      verdicts.set(`${path} ${component}`, { text, cls });
      verdict.textContent = text;
      verdict.className = cls;
    };
    // Its keyed state (processors that import wasi:keyvalue): the first keys.
    let keys = { keys: [], nextAfter: null };
    try { keys = await api("GET", `${base}:processors/${encodeURIComponent(component)}/keys?limit=${KEYS_SHOWN}`); }
    catch (e) { keys = { keys: [], nextAfter: null, error: e.message }; }
    const keyRows = keys.keys.map((k) => h("tr", {},
      h("td", { class: "mono" }, k.key),
      h("td", { class: "mono payload" }, typeof k.value === "string" ? k.value : json(k.value))));
    const keyTable = keys.keys.length
      ? h("table", { "data-testid": `keys-${component}` },
        h("thead", {}, h("tr", {}, h("th", {}, "key"), h("th", {}, "value"))), h("tbody", {}, keyRows))
      : "";
    const keyNote = keys.error ? h("p", { class: "bad" }, keys.error)
      : keys.nextAfter ? h("p", { class: "muted" }, `first ${KEYS_SHOWN} keys shown; the rest: streamhost keys ${path} ${component} --all`)
        : "";
    // A shadow version (deploy --shadow): its diff, promote or discard.
    let shadow = null;
    try { shadow = await api("GET", `${base}:processors/${encodeURIComponent(component)}/shadow`); }
    catch (e) { if (!e.message.includes("shadow-not-found")) shadow = { failure: e.message }; }
    procs.push(h("div", {},
      h("p", {}, h("b", {}, component), ` · checkpoint ${p.checkpointOffset} · ${p.status} · digest `,
        h("code", { "data-testid": `digest-${component}` }, (p.digest ?? "").slice(0, 16)), " ",
        h("button", { onclick: async () => {
          remember(" verifying…", "muted");
          try {
            const v = await api("POST", `${base}:verifyProcessor`, { component });
            const keysNote = v.keysCompared ? `, ${v.keysCompared} keys compared` : "";
            if (v.matches) remember(` ✓ state = fold(log) through offset ${v.checkpointOffset}${keysNote}`, "ok");
            else if (v.firstDifferingKey) remember(` ✗ key ${v.firstDifferingKey.key} differs from the refold`, "bad");
            else remember(" ✗ the stored state differs from the refold", "bad");
          } catch (e) { remember(" " + e.message, "bad"); }
        } }, "Verify"), verdict),
      p.lastFailure && !p.lastFailure.resolved ? h("pre", { class: "bad" }, `${p.lastFailure.message}\n${p.lastFailure.repro ?? ""}`) : "",
      p.lastFailure && p.lastFailure.resolved ? h("p", { class: "muted" }, `resolved: failed at offset ${p.lastFailure.offset ?? "?"} (${p.lastFailure.failedAt}), folded past since`) : "",
      h("pre", {}, pretty(p.state)), keyTable, keyNote,
      shadow ? shadowView(base, component, shadow, () => refreshDetails(path, ui)) : "",
      timeTravelView(base, path, component, core.maxOffset, p.checkpointOffset)));
  }
  if (!processors.length) procs.push(h("p", { class: "muted" }, "no processors on this stream"));
  ui.procs.replaceChildren(...procs);

  if (settings.project) {
    const list = await api("GET", `${namespace()}/effects?stream=${encodeURIComponent(path)}&limit=100`);
    const rows = list.effects.map((e) => effectRow(e, () => refreshDetails(path, ui)));
    if (!rows.length) rows.push(h("tr", {}, h("td", { colspan: 9, class: "muted" }, "no effects")));
    ui.effects.replaceChildren(...rows);
  } else {
    ui.effects.replaceChildren();
  }
}

// A processor's shadow against its live state: the RFC 6902 diff, the keys'
// diff, the held effects, and the two buttons.
function shadowView(base, component, s, after) {
  if (s.failure) return h("p", { class: "bad" }, `shadow: ${s.failure}`);
  const ops = (s.stateDiff ?? []).map((op) => h("tr", {},
    h("td", { class: "mono" }, op.op), h("td", { class: "mono" }, op.path),
    h("td", { class: "mono payload" }, op.value === undefined ? "" : json(op.value))));
  const diff = !s.stateDiff ? ""
    : ops.length ? h("table", { "data-testid": `shadow-diff-${component}` },
      h("thead", {}, h("tr", {}, ["op", "path", "value"].map((c) => h("th", {}, c)))), h("tbody", {}, ops))
      : h("p", { class: "muted", "data-testid": `shadow-diff-${component}` }, "the states are equal");
  const k = s.keysDiff;
  const run = h("input", { type: "checkbox", "data-testid": `run-held-${component}` });
  const act = (action, body) => h("button", {
    "data-testid": `${action}-${component}`,
    onclick: async () => {
      try { await api("POST", `${base}:${action}Shadow`, body()); await after(); } catch (e) { showError(e); }
    },
  }, action === "promote" ? "Promote" : "Discard");
  return h("div", { class: "shadow", "data-testid": `shadow-${component}` },
    h("p", {}, h("b", {}, "shadow "), h("code", {}, (s.digest ?? "").slice(0, 16)),
      ` · ${s.status} · folded through ${s.shadowOffset} of ${s.checkpointOffset} · ${s.heldEffects.count} held effects`,
      s.error ? h("span", { class: "bad" }, ` · ${s.error}`) : ""),
    diff,
    k ? h("p", { class: "muted" }, `keys: ${k.added} added, ${k.removed} removed, ${k.changed} changed`) : "",
    h("p", {}, act("promote", () => ({ component, runHeldEffects: run.checked })), " ",
      h("label", {}, run, " run held effects"), " ", act("discard", () => ({ component }))));
}

// A slider over the stream's offsets: the processor's state at the chosen
// one, folded on demand by the server (`:processors/{component}/at/{offset}`).
function timeTravelView(base, path, component, maxOffset, checkpoint) {
  const key = `${path} ${component}`;
  const kept = timeTravel.get(key);
  const slider = h("input", { type: "range", min: 0, max: maxOffset, value: kept?.offset ?? checkpoint, "data-testid": `at-${component}` });
  const label = h("span", { "data-testid": `at-offset-${component}` }, String(slider.value));
  const shown = h("pre", { "data-testid": `at-state-${component}` }, kept?.text ?? "");
  slider.addEventListener("input", () => { label.textContent = slider.value; });
  slider.addEventListener("change", async () => {
    const offset = slider.value;
    let text;
    try {
      const at = await api("GET", `${base}:processors/${encodeURIComponent(component)}/at/${offset}`);
      text = `state at offset ${at.offset}:\n${pretty(at.state)}`;
    } catch (e) { text = e.message; }
    timeTravel.set(key, { offset, text });
    shown.textContent = text;
  });
  return h("div", { class: "time-travel" }, h("p", {}, "state at offset ", slider, " ", label), shown);
}

function effectRow(e, after) {
  const act = (action) => h("button", { "data-testid": `${action}-effect-${e.id}`, onclick: async () => {
    try { await api("POST", `${namespace()}/effects/${e.id}:${action}`, {}); await after(); } catch (err) { showError(err); }
  } }, action === "retry" ? "Retry" : "Cancel");
  const target = Object.keys(e.target ?? {})[0] ?? "";
  const cls = e.status === "failed" ? "pill bad" : e.status === "succeeded" ? "pill ok" : "pill";
  return h("tr", { "data-effect": e.id },
    h("td", {}, e.id), h("td", {}, e.component), h("td", { class: "mono" }, e.key), h("td", {}, target),
    h("td", {}, h("span", { class: cls }, e.status)),
    // When a pending effect runs next: its notBefore (a timer) or its retry.
    h("td", { class: "mono", title: e.notBefore ? `not before ${e.notBefore}` : "" },
      e.status === "pending" ? (e.nextAttemptAt ?? "") : ""),
    h("td", {}, e.attempts), h("td", { class: "bad mono" }, e.lastError ?? ""),
    h("td", {}, ["failed", "cancelled"].includes(e.status) ? act("retry") : "", " ",
      ["pending", "failed"].includes(e.status) ? act("cancel") : ""));
}

// --- Effects of the project ---------------------------------------------
async function effectsView() {
  setActive("effects");
  const body = h("tbody", { "data-testid": "all-effects" });
  $("#view").replaceChildren(h("h2", {}, "Effects"),
    h("table", {}, h("thead", {}, h("tr", {}, ["id", "component", "key", "target", "status", "due", "attempts", "last error", ""].map((c) => h("th", {}, c)))), body));
  if (!settings.project) { body.append(h("tr", {}, h("td", { colspan: 9, class: "muted" }, "effects belong to projects: enter one"))); return; }
  const list = await api("GET", `${namespace()}/effects?limit=500`);
  for (const e of list.effects) body.append(effectRow(e, effectsView));
  if (!list.effects.length) body.append(h("tr", {}, h("td", { colspan: 9, class: "muted" }, "no effects")));
}

// --- Parked ingest of the project ------------------------------------------
// Accepted events refused for good: kept until redriven (appended again,
// once at most) or discarded (an error-occurred line on the stream).
async function ingestView() {
  setActive("ingest");
  const body = h("tbody", { "data-testid": "parked" });
  $("#view").replaceChildren(h("h2", {}, "Parked ingest"),
    h("p", { class: "muted" }, "Accepted events refused for good, kept (and counted against ingest capacity) until redriven or discarded."),
    h("table", {}, h("thead", {}, h("tr", {}, ["id", "stream", "source", "key", "reason", "parked at", ""].map((c) => h("th", {}, c)))), body));
  if (!settings.project) { body.append(h("tr", {}, h("td", { colspan: 7, class: "muted" }, "parked events belong to projects: enter one"))); return; }
  const list = await api("GET", `${namespace()}/ingest/parked?limit=500`);
  for (const p of list.parked) {
    const act = (action) => h("button", { "data-testid": `${action}-parked-${p.id}`, onclick: async () => {
      try { await api("POST", `${namespace()}/ingest/parked/${p.id}:${action}`, {}); await ingestView(); } catch (err) { showError(err); }
    } }, action === "redrive" ? "Redrive" : "Discard");
    const key = p.event?.idempotencyKey ?? (p.nats ? `${p.nats.subject} #${p.nats.sequence}` : "");
    body.append(h("tr", { "data-parked": p.id },
      h("td", {}, p.id), h("td", { class: "mono" }, p.path), h("td", {}, p.source), h("td", { class: "mono" }, key),
      h("td", { class: "bad mono" }, p.reason), h("td", { class: "muted" }, p.parkedAt),
      h("td", {}, p.event ? act("redrive") : "", " ", act("discard"))));
  }
  if (!list.parked.length) body.append(h("tr", {}, h("td", { colspan: 7, class: "muted" }, "nothing parked")));
}

// --- Components -----------------------------------------------------------
async function componentsView() {
  setActive("components");
  const body = h("tbody", { "data-testid": "components" });
  $("#view").replaceChildren(h("h2", {}, "Components"),
    h("table", {}, h("thead", {}, h("tr", {}, ["name", "digest", "exports", "versions"].map((c) => h("th", {}, c)))), body));
  if (!settings.project) { body.append(h("tr", {}, h("td", { colspan: 4, class: "muted" }, "components belong to projects: enter one"))); return; }
  const list = await api("GET", `${namespace()}/components`);
  for (const c of list.components) {
    const versions = await api("GET", `${namespace()}/components/${encodeURIComponent(c.name)}/versions`);
    body.append(h("tr", {},
      h("td", { class: "mono" }, c.name), h("td", { class: "mono" }, (c.digest ?? "").slice(0, 16)),
      h("td", { class: "mono" }, (c.exports ?? []).join(", ")),
      h("td", {}, versions.versions.map((v) => h("div", { class: "mono muted" }, `${v.digest.slice(0, 12)} · ${v.deployedAt}`)))));
  }
  if (!list.components.length) body.append(h("tr", {}, h("td", { colspan: 4, class: "muted" }, "nothing deployed")));
}

// --- Routing ---------------------------------------------------------------
let cleanup = () => {};
async function route() {
  cleanup(); cleanup = () => {};
  showError(null);
  const [name, query] = (location.hash.slice(2) || "streams").split("?");
  const params = new URLSearchParams(query ?? "");
  const views = { streams: streamsView, stream: streamView, trace: traceView, components: componentsView, effects: effectsView, ingest: ingestView };
  try { await (views[name] ?? streamsView)(params); } catch (e) { showError(e); }
}
window.addEventListener("hashchange", route);
route();
