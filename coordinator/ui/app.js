// Sluice web UI: polls the coordinator's REST API (/api/v1) and draws the selected job.
// No framework and no build step; text from the API only ever reaches the page as text nodes.
"use strict";

const POLL_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";
let selected = decodeURIComponent((location.hash.match(/job=([^&]+)/) || [])[1] || "");
let selectedVertex = null; // a vertex id: its subtasks are listed under the graph
let selectedCheckpoint = null; // a checkpoint id: its tasks' figures are listed under the table
let last = { graph: null, checkpoints: [], figures: [] }; // the latest answers, to redraw a detail on a click

function el(tag, attrs = {}, ...children) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null) continue;
    if (k === "class") node.setAttribute("class", v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children.flat()) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

async function get(path) {
  const response = await fetch(path, { cache: "no-store" });
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

const fmt = {
  rate: (v) => v >= 1000 ? `${(v / 1000).toFixed(1)}k/s` : `${v.toFixed(v < 10 ? 1 : 0)}/s`,
  secs: (v) => v === null || v === undefined ? "–" : v < 1 ? `${Math.round(v * 1000)} ms` : `${v.toFixed(2)} s`,
  bytes: (v) => v < 1024 ? `${v} B` : v < 1048576 ? `${(v / 1024).toFixed(1)} KiB` : `${(v / 1048576).toFixed(1)} MiB`,
  pct: (v) => `${Math.round(v * 100)} %`,
};

// a checkpoint figure's value, formatted by the unit the REST answer declares for it (its "figures" list)
function figure(f, v) {
  if (v === null || v === undefined) return "–";
  if (f.unit === "s") return fmt.secs(v);
  if (f.unit === "bytes") return fmt.bytes(v);
  if (f.unit === "bool") return v ? "yes" : "no";
  return v.toLocaleString();
}

// -- job list, overview, workers ----------------------------------------------------

function drawOverview(o) {
  const states = Object.entries(o.jobs).map(([s, n]) => `${n} ${s.toLowerCase()}`).join(", ") || "no jobs";
  document.getElementById("overview").textContent =
    `${o.workers} worker${o.workers === 1 ? "" : "s"} · ${o.slots_total} slots · ${states}`;
}

function drawJobs(jobs) {
  if (!selected && jobs.length) {
    const running = jobs.find((j) => j.state === "RUNNING") || jobs[jobs.length - 1];
    selected = running.job_id;
  }
  const list = document.getElementById("jobs");
  list.replaceChildren(...jobs.map((j) => el("li", {
    class: j.job_id === selected ? "selected" : "", "data-job": j.job_id,
    onclick: () => {
      if (selected !== j.job_id) { selectedVertex = null; selectedCheckpoint = null; }
      selected = j.job_id; location.hash = `job=${encodeURIComponent(j.job_id)}`; refresh(); },
  }, el("span", { class: "name" }, j.name), " ", el("span", { class: `state ${j.state}` }, j.state),
  el("div", { class: "id" }, `${j.job_id} · ${plural(j.checkpoints_completed, "checkpoint")} · ` +
    plural(j.restarts, "restart")))));
}

function drawWorkers(workers) {
  const body = document.querySelector("#workers tbody");
  body.replaceChildren(...workers.map((w) => el("tr", {},
    el("td", { title: `${w.host}:${w.data_port}, pid ${w.pid ?? "?"}` }, w.worker_id),
    el("td", { class: "num" }, w.slots),
    el("td", { class: "num" }, fmt.secs(w.last_heartbeat_s_ago)),
    el("td", {}, w.metrics_url ? el("a", { href: w.metrics_url, target: "_blank", rel: "noopener" }, "metrics") : "–"))));
}

// -- the job graph ------------------------------------------------------------------

function layout(vertices, edges) {
  // column = longest path from a source; rows in plan order within a column
  const depth = new Map(vertices.map((v) => [v.id, 0]));
  for (let round = 0; round < vertices.length; round++) {
    for (const e of edges) depth.set(e.to, Math.max(depth.get(e.to), depth.get(e.from) + 1));
  }
  const rows = new Map();
  const pos = new Map();
  for (const v of vertices) {
    const col = depth.get(v.id);
    const row = rows.get(col) || 0;
    rows.set(col, row + 1);
    pos.set(v.id, { x: 20 + col * 260, y: 20 + row * 110 });
  }
  return { pos, width: 20 + (Math.max(0, ...depth.values()) + 1) * 260, height: 20 + Math.max(1, ...rows.values()) * 110 };
}

function drawGraph(graph) {
  const W = 200, H = 78;
  const { pos, width, height } = layout(graph.vertices, graph.edges);
  const svg = el("svg:svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": "job graph" });
  svg.append(el("svg:defs", {}, el("svg:marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5,
    markerWidth: 8, markerHeight: 8, orient: "auto-start-reverse" }, el("svg:path", { d: "M0,0 L10,5 L0,10 z",
    fill: "#8a94a8" }))));
  for (const e of graph.edges) {
    const a = pos.get(e.from), b = pos.get(e.to);
    const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2, mx = (x1 + x2) / 2;
    svg.append(el("svg:path", { class: "edge", d: `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}`,
      "marker-end": "url(#arrow)" }));
    svg.append(el("svg:text", { class: "edge-label", x: mx, y: (y1 + y2) / 2 - 6, "text-anchor": "middle" },
      e.partitioner));
  }
  for (const v of graph.vertices) {
    const p = pos.get(v.id);
    const title = v.subtasks.map((s) => `#${s.subtask} on ${s.worker ?? "?"}: ${fmt.rate(s.records_in_per_s)} in, ` +
      `${fmt.rate(s.records_out_per_s)} out, backpressured ${fmt.pct(s.backpressured_ratio)}, ` +
      `busy ${fmt.pct(s.busy_ratio)}, output pool ${fmt.pct(s.output_pool_usage)}`).join("\n");
    svg.append(el("svg:g", { class: `vertex ${v.backpressure}${v.id === selectedVertex ? " selected" : ""}`,
      "data-vertex": v.name, transform: `translate(${p.x},${p.y})`,
      onclick: () => { selectedVertex = selectedVertex === v.id ? null : v.id; drawGraph(last.graph); } },
    el("svg:title", {}, `${v.name}\n${title}`),
    el("svg:rect", { width: W, height: H, rx: 8 }),
    el("svg:text", { class: "title", x: 10, y: 20 }, clip(v.name, 26)),
    el("svg:text", { class: "sub", x: 10, y: 38 }, `parallelism ${v.parallelism} · busy ${fmt.pct(v.busy_ratio)}`),
    el("svg:text", { class: "sub", x: 10, y: 54 }, `in ${fmt.rate(v.records_in_per_s)} · out ${fmt.rate(v.records_out_per_s)}`),
    el("svg:text", { class: "sub", x: 10, y: 70 }, `backpressured ${fmt.pct(v.backpressured_ratio)} (${v.backpressure})`)));
  }
  document.getElementById("graph").replaceChildren(graph.vertices.length ? svg : el("p", {}, "not deployed yet"));
  drawVertexDetail(graph.vertices.find((v) => v.id === selectedVertex));
}

function table(headers, rows) {
  return el("table", { class: "compact" }, el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.map((cells) => el("tr", {}, cells.map((c) => el("td", { class: typeof c === "number" ? "num" : "" },
      c))))));
}

function drawVertexDetail(v) {
  const box = document.getElementById("vertex-detail");
  box.hidden = !v;
  if (!v) return;
  box.replaceChildren(el("h4", {}, `${v.name}: subtasks`), table(
    ["subtask", "worker", "state", "in", "out", "backpressured", "busy", "output pool", "input queue", "output queue"],
    v.subtasks.map((s) => [s.subtask, s.worker ?? "–", s.state ?? "–", fmt.rate(s.records_in_per_s),
      fmt.rate(s.records_out_per_s), fmt.pct(s.backpressured_ratio), fmt.pct(s.busy_ratio),
      fmt.pct(s.output_pool_usage), s.input_queue, s.output_queue])));
}

function taskName(task) {
  // "vertex:subtask" -> "Name #subtask", from the graph drawn last
  const [vertex, subtask] = task.split(":");
  const v = last.graph && last.graph.vertices.find((x) => String(x.id) === vertex);
  return v ? `${v.name} #${subtask}` : task;
}

function drawCheckpointDetail(history) {
  const c = history.find((x) => x.checkpoint_id === selectedCheckpoint);
  const box = document.getElementById("checkpoint-detail");
  box.hidden = !c;
  if (!c) return;
  const parts = [el("h4", {}, `checkpoint ${c.checkpoint_id}: tasks`)];
  if (c.failure_reason) parts.push(el("p", { class: "error" }, c.failure_reason));
  // every declared figure some task measured (optional ones, as a state backend's, only where there are any)
  const shown = last.figures.filter((f) => c.tasks.some((t) => t[f.name] !== undefined));
  parts.push(c.tasks.length ? table(["task", ...shown.map((f) => f.label)],
    c.tasks.map((t) => [taskName(t.task), ...shown.map((f) => figure(f, t[f.name]))]))
    : el("p", {}, "no task figures (an earlier attempt's checkpoint, or no task acknowledged)"));
  box.replaceChildren(...parts);
}

function plural(n, word) { return `${n} ${word}${n === 1 ? "" : "s"}`; }

function clip(text, n) { return text.length > n ? `${text.slice(0, n - 1)}…` : text; }

// -- checkpoints --------------------------------------------------------------------

function drawCheckpointChart(history) {
  const items = history.slice(-40);
  const width = Math.max(360, 40 + items.length * 22), height = 170, base = 140, top = 14;
  const max = Math.max(0.001, ...items.map((c) => c.duration_s || 0));
  const svg = el("svg:svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": "checkpoint durations" });
  svg.append(el("svg:line", { class: "axis", x1: 36, y1: base, x2: width - 4, y2: base }));
  svg.append(el("svg:text", { class: "tick", x: 2, y: top + 4 }, fmt.secs(max)));
  svg.append(el("svg:text", { class: "tick", x: 2, y: base }, "0"));
  items.forEach((c, i) => {
    const h = Math.max(2, ((c.duration_s || 0) / max) * (base - top));
    const x = 40 + i * 22;
    svg.append(el("svg:rect", { class: `bar ${c.status}`, x, y: base - h, width: 16, height: h,
      "data-checkpoint": c.checkpoint_id },
    el("svg:title", {}, `checkpoint ${c.checkpoint_id} ${c.status}: ${fmt.secs(c.duration_s)}, ` +
      `state ${fmt.bytes(c.state_bytes)}, in-flight ${fmt.bytes(c.inflight_bytes)}` +
      (c.failure_reason ? `\n${c.failure_reason}` : ""))));
    if (items.length <= 20 || i % 5 === 0) {
      svg.append(el("svg:text", { class: "tick", x: x + 8, y: base + 14, "text-anchor": "middle" }, c.checkpoint_id));
    }
  });
  document.getElementById("checkpoint-chart").replaceChildren(items.length ? svg : el("p", {}, "no checkpoints yet"));
}

// the checkpoint's own figures: those the tasks' fold into (a sum or a max), as the REST answer declares them
function aggregated() { return last.figures.filter((f) => f.aggregate); }

function drawCheckpointTable(history) {
  const rows = history.slice(-15).reverse().map((c) => el("tr", { "data-checkpoint": c.checkpoint_id,
    class: c.checkpoint_id === selectedCheckpoint ? "selected" : "",
    onclick: () => {
      selectedCheckpoint = selectedCheckpoint === c.checkpoint_id ? null : c.checkpoint_id;
      drawCheckpointTable(last.checkpoints);
    },
    title: c.tasks.map((t) => `${t.task}: ` + last.figures.filter((f) => t[f.name] !== undefined)
      .map((f) => `${f.label} ${figure(f, t[f.name])}`).join(", ")).join("\n") },
  el("td", { class: "num" }, c.checkpoint_id + (c.savepoint ? " (savepoint)" : "")),
  el("td", { class: c.status }, c.status),
  el("td", {}, c.mode),
  el("td", { class: "num" }, fmt.secs(c.duration_s)),
  ...aggregated().map((f) => el("td", { class: "num" }, figure(f, c[f.name])))));
  document.querySelector("#checkpoints thead").replaceChildren(el("tr", {},
    ["id", "status", "mode", "duration", ...aggregated().map((f) => (f.aggregate === "max" ? "max " : "") + f.label)]
      .map((h) => el("th", {}, h))));
  document.querySelector("#checkpoints tbody").replaceChildren(...rows);
  drawCheckpointDetail(history);
}

function drawRestarts(r) {
  const parts = [el("p", {}, r.restarts ? `${r.restarts} restart${r.restarts === 1 ? "" : "s"}, ` +
    `last took ${fmt.secs(r.last_restart_s)}` + (r.restored_checkpoint_id !== null
    ? `, restored checkpoint ${r.restored_checkpoint_id}` : "") : "no restarts")];
  if (r.failures.length) parts.push(el("ul", { class: "failures" }, r.failures.slice(-5).map((f) => el("li", {}, f))));
  document.getElementById("restarts").replaceChildren(...parts);
}

function drawJob(job) {
  document.getElementById("job-title").textContent = `${job.name} (${job.job_id})`;
  const state = document.getElementById("job-state");
  state.textContent = job.state;
  state.className = `state ${job.state}`;
  document.getElementById("job-facts").textContent = `attempt ${job.attempt} · ${plural(job.restarts, "restart")} · ` +
    `${plural(job.tasks_total, "task")} · ` +
    `${job.checkpoint_mode ?? "no"} checkpoints every ${fmt.secs(job.checkpoint_interval_s)}`;
  const error = document.getElementById("job-error");
  error.hidden = !job.error;
  error.textContent = job.error;
}

// -- polling ------------------------------------------------------------------------

async function refresh() {
  const status = document.getElementById("status");
  try {
    const [overview, jobs, workers] = await Promise.all([get("/api/v1/overview"), get("/api/v1/jobs"),
      get("/api/v1/workers")]);
    drawOverview(overview);
    drawJobs(jobs.jobs);
    drawWorkers(workers.workers);
    const known = jobs.jobs.some((j) => j.job_id === selected);
    document.getElementById("job").hidden = !known;
    document.getElementById("empty").hidden = known;
    if (known) {
      const base = `/api/v1/jobs/${encodeURIComponent(selected)}`;
      const [job, graph, checkpoints, restarts] = await Promise.all([get(base), get(`${base}/graph`),
        get(`${base}/checkpoints?limit=40`), get(`${base}/restarts`)]);
      last = { graph, checkpoints: checkpoints.history, figures: checkpoints.figures };
      drawJob(job);
      drawGraph(graph);
      drawCheckpointChart(checkpoints.history);
      drawCheckpointTable(checkpoints.history);
      drawRestarts(restarts);
    }
    status.textContent = "";
  } catch (err) {
    status.textContent = `cannot reach the coordinator (${err.message}); retrying`;
  }
}

refresh();
setInterval(refresh, POLL_MS);
