// rmqstore console: the few pages that update themselves (health tasks, live tail, consumer
// group lag). Message text is only ever set with textContent, after control and
// bidirectional characters are turned into visible escapes, never parsed as HTML.
"use strict";

const UNSHOWN = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;
function visible(v) {
  if (v === null || v === undefined) return "";
  return String(v).replace(UNSHOWN, c => "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0"));
}
function cell(row, text) {
  const td = document.createElement("td");
  td.textContent = visible(text);
  row.appendChild(td);
  return td;
}
const store = () => document.body.dataset.store;
const csrf = () => document.querySelector('meta[name="csrf"]').content;

// -- health: background tasks with a progress bar and a result table --------------------
function renderTask(t) {
  let box = document.getElementById("task-" + t.kind);
  if (!box) {
    box = document.createElement("section");
    box.id = "task-" + t.kind;
    box.className = "task-box";
    document.getElementById("tasks").appendChild(box);
  }
  box.replaceChildren();
  const h = document.createElement("h2");
  h.textContent = t.kind + ": " + t.state + (t.state !== "running" ? " in " + t.seconds + " s" : "");
  const bar = document.createElement("progress");
  bar.max = Math.max(1, t.total);
  bar.value = t.done;
  box.append(h, bar);
  if (t.error) {
    const p = document.createElement("p");
    p.className = "error";
    p.textContent = visible(t.error);
    box.appendChild(p);
  }
  if (t.result !== null) box.appendChild(resultTable(t.result));
}
function resultTable(result) {
  const table = document.createElement("table");
  table.className = "result";
  const rows = Array.isArray(result) ? result : Object.entries(result).map(([k, v]) => ({field: k, value: v}));
  const keys = rows.length ? Object.keys(rows[0]) : [];
  const head = table.createTHead().insertRow();
  keys.forEach(k => { const th = document.createElement("th"); th.textContent = k; head.appendChild(th); });
  const body = table.createTBody();
  rows.forEach(r => {
    const tr = body.insertRow();
    keys.forEach(k => cell(tr, typeof r[k] === "object" && r[k] !== null ? JSON.stringify(r[k]) : r[k]));
  });
  return table;
}
async function follow(id) {
  for (;;) {
    const t = await (await fetch("/api/tasks/" + id)).json();
    renderTask(t);
    if (t.state !== "running") return;
    await new Promise(r => setTimeout(r, 300));
  }
}
function health() {
  document.querySelectorAll("button.task").forEach(b => b.addEventListener("click", async () => {
    const r = await fetch(`/api/s/${store()}/tasks?kind=${b.dataset.kind}`,
                          {method: "POST", headers: {"X-Console-CSRF": csrf()}});
    const t = await r.json();
    if (t.id) follow(t.id);
  }));
}

// -- live tail: server-sent events, filters, pause and resume -----------------------------
function tail() {
  const form = document.getElementById("tail-form");
  const status = document.getElementById("tail-status");
  const tbody = document.querySelector("#tail tbody");
  const pauseButton = document.getElementById("tail-pause");
  let source = null, last = null, count = 0;
  function open() {
    const q = new URLSearchParams();
    for (const [k, v] of new FormData(form)) if (v) q.set(k, v);
    if (last !== null) q.set("from", last);
    source = new EventSource(`/api/s/${store()}/tail/events?` + q);
    source.addEventListener("hello", e => {
      if (last === null) last = JSON.parse(e.data).from;
      status.textContent = "live";
    });
    source.addEventListener("messages", e => {
      last = e.lastEventId;
      document.getElementById("tail-pos").textContent = last;
      for (const m of JSON.parse(e.data)) {
        const tr = tbody.insertRow(0);
        tr.dataset.offset = m.commitLogOffset;
        [m.topic, m.queueId, m.queueOffset, new Date(m.storeTimestamp).toISOString(), m.msgId, m.tags, m.keys,
         m.body].forEach(v => cell(tr, v));
        count += 1;
      }
      while (tbody.rows.length > 500) tbody.deleteRow(-1);
      document.getElementById("tail-count").textContent = count;
    });
    source.addEventListener("problem", e => { status.textContent = visible(JSON.parse(e.data).error); });
    source.onerror = () => { status.textContent = "reconnecting"; };
  }
  function close() { if (source) source.close(); source = null; }
  form.addEventListener("submit", e => { e.preventDefault(); close(); open(); });
  pauseButton.addEventListener("click", () => {
    if (source) { close(); status.textContent = "paused"; pauseButton.textContent = "resume"; }
    else { open(); pauseButton.textContent = "pause"; }
  });
  open();
}

// -- consumer groups: the lag table and chart refresh while the page is open -----------
function groups() {
  const live = document.getElementById("groups-live");
  setInterval(async () => {
    const r = await fetch(live.dataset.refresh);
    if (!r.ok) return;
    const doc = new DOMParser().parseFromString(await r.text(), "text/html");
    const fresh = doc.getElementById("groups-live");
    if (fresh) live.replaceChildren(...fresh.childNodes);
  }, 5000);
}

// -- DLQ: resend to the origin topic (only offered when the console may write) ----------
function dlq() {
  document.querySelectorAll("button.resend").forEach(b => b.addEventListener("click", async () => {
    const r = await fetch(`/api/s/${store()}/dlq/resend?offset=${b.dataset.offset}`,
                          {method: "POST", headers: {"X-Console-CSRF": csrf()}});
    const out = await r.json();
    b.nextElementSibling.textContent = visible(r.ok ? "resent as " + out.msgId : out.error);
  }));
}

document.addEventListener("DOMContentLoaded", () => {
  const page = document.body.dataset.page;
  if (page === "dlq") dlq();
  if (page === "health") health();
  if (page === "tail") tail();
  if (page === "groups") groups();
});
