// relax-gym viewer: curves, the step list and rollouts of one run directory, from the app's JSON API.
// Vanilla JS on purpose: the page is served from the package with no network and no build step.
"use strict";

const POLL_MS = 5000;
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"];
const state = { steps: [], stepsKey: "", metricsKey: "", panes: {}, timer: null };

const $ = (sel, root = document) => root.querySelector(sel);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
  return node;
}

async function getJSON(url) {
  const response = await fetch(url, { cache: "no-store" });
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  return response.json();
}

const fmt = (x, digits = 3) => (x === null || x === undefined || Number.isNaN(x)) ? "–" : Number(x).toFixed(digits);

// -- charts (SVG drawn here from metrics.jsonl rows) ------------------------------------------------------------------

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

function lineChart(figure, title, series) {
  figure.replaceChildren(el("figcaption", {}, title));
  series = series.filter((s) => s.points.length);
  if (!series.length) { figure.append(el("div", { class: "empty" }, "no rows yet")); return; }
  const W = 400, H = 150, L = 44, R = 8, T = 8, B = 22;
  const xs = series.flatMap((s) => s.points.map((p) => p[0]));
  const ys = series.flatMap((s) => s.points.map((p) => p[1]));
  let [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  const ticks = x0 === x1 ? [x0] : [x0, x1];
  if (x0 === x1) { x0 -= 0.5; x1 += 0.5; }  // one step: its point in the middle
  if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  const sx = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
  const sy = (y) => H - B - (y - y0) / (y1 - y0) * (H - T - B);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img" });
  for (const f of [0, 0.5, 1]) {
    const y = y0 + f * (y1 - y0);
    root.append(svg("line", { x1: L, x2: W - R, y1: sy(y), y2: sy(y), stroke: "#e4e7ec" }));
    const label = svg("text", { x: L - 4, y: sy(y) + 4, "text-anchor": "end", "font-size": 10, fill: "#6b7385" });
    label.textContent = Math.abs(y) >= 100 ? y.toFixed(0) : y.toPrecision(3);
    root.append(label);
  }
  for (const x of ticks) {
    const anchor = ticks.length === 1 ? "middle" : x === x0 ? "start" : "end";
    const label = svg("text", { x: sx(x), y: H - 6, "text-anchor": anchor, "font-size": 10, fill: "#6b7385" });
    label.textContent = `step ${Math.round(x)}`;
    root.append(label);
  }
  series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length];
    const d = s.points.map((p, j) => `${j ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join("");
    root.append(svg("path", { d, fill: "none", stroke: color, "stroke-width": 1.6, "vector-effect": "non-scaling-stroke" }));
    for (const p of s.points.length <= 40 ? s.points : []) {
      root.append(svg("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.2, fill: color }));
    }
  });
  figure.append(root, el("div", { class: "legend" }, series.map((s, i) =>
    el("span", {}, el("i", { style: `background:${COLORS[i % COLORS.length]}` }), s.name))));
}

function column(rows, key, minStep = 0) {
  return rows.filter((r) => r.step >= minStep && typeof r[key] === "number" && Number.isFinite(r[key]))
    .map((r) => [r.step, r[key]]);
}

function drawCharts(rows) {
  const keys = new Set(rows.flatMap((r) => Object.keys(r)));
  lineChart($("#chart-reward"), "Reward", [
    { name: "train reward_mean", points: column(rows, "reward_mean", 1) },
    { name: "eval_reward", points: column(rows, "eval_reward") },
  ]);
  const accuracy = [...keys].filter((k) => /accuracy/.test(k)).sort().slice(0, 5);
  lineChart($("#chart-accuracy"), "Accuracy", accuracy.map((k) => ({ name: k, points: column(rows, k) })));
  const timing = ["time_step_s", "time_rollout_s", "time_train_s", "time_sync_s"].filter((k) => keys.has(k));
  lineChart($("#chart-timing"), "Time per step (s)", timing.map((k) => ({ name: k, points: column(rows, k, 1) })));
}

// -- the step list ----------------------------------------------------------------------------------------------------

function drawSteps() {
  const list = $("#step-list");
  list.replaceChildren(...state.steps.map((s) => {
    const what = [s.train ? `${s.train} train ${fmt(s.train_reward, 2)}` : null, s.eval ? `${s.eval} eval ${fmt(s.eval_reward, 2)}` : null]
      .filter(Boolean).join(" · ");
    const item = el("li", { "data-step": s.step, onclick: () => showStep("a", s.step) },
      el("span", { class: "n" }, s.step), el("span", { class: "what" }, what),
      el("button", { type: "button", title: "show in the right pane", onclick: (e) => { e.stopPropagation(); showStep("b", s.step); } }, "B"));
    return item;
  }));
  if (!state.steps.length) list.append(el("li", { class: "none" }, "no rollout records yet"));
  const statuses = [...new Set(state.steps.flatMap((s) => s.statuses))].sort();
  const tools = [...new Set(state.steps.flatMap((s) => s.tools))].sort();
  fillOptions($("#f-status"), statuses, [["", "any"]]);
  fillOptions($("#f-tool"), tools, [["", "any"], ["none", "none called"]]);
  for (const id of ["a", "b"]) fillOptions($(`#pane-${id} .pane-step`), state.steps.map((s) => String(s.step)), []);
  markSteps();
}

function fillOptions(select, values, fixed) {
  const keep = select.value;
  select.replaceChildren(...fixed.map(([v, t]) => el("option", { value: v }, t)), ...values.map((v) => el("option", { value: v }, v)));
  if ([...select.options].some((o) => o.value === keep)) select.value = keep;
}

function markSteps() {
  for (const li of document.querySelectorAll("#step-list li[data-step]")) {
    const n = Number(li.dataset.step);
    li.classList.toggle("in-a", state.panes.a?.step === n);
    li.classList.toggle("in-b", !$("#pane-b").hidden && state.panes.b?.step === n);
  }
}

// -- rollouts ---------------------------------------------------------------------------------------------------------

function mediaNode(part) {
  if (part.omitted) return el("div", { class: "omitted" }, `${part.type}: ${part.omitted}`);
  const src = "/" + part.url;
  if (part.type === "video") {
    const t = part.timestamps || [];
    const span = t.length ? `${fmt(t[0], 2)}–${fmt(t[t.length - 1], 2)} s of ${fmt(part.duration_s, 2)} s` : "";
    return el("figure", { class: "media video" },
      el("video", { src, controls: true, muted: true, loop: true, preload: "metadata", playsinline: true }),
      part.audio_url ? el("audio", { src: "/" + part.audio_url, controls: true, preload: "metadata" }) : null,
      el("figcaption", { class: "caption" }, `video: ${part.frames} frames ${part.width}x${part.height}, ${span}; ` +
        `frame times ${t.map((x) => fmt(x, 2)).join(" ")}`));
  }
  if (part.type === "audio") {
    return el("figure", { class: "media audio" }, el("audio", { src, controls: true, preload: "metadata" }),
      el("figcaption", { class: "caption" }, `audio: ${fmt(part.duration_s, 2)} s from ${fmt(part.start_s, 2)} s, ${part.sample_rate} Hz`));
  }
  return el("figure", { class: "media image" }, el("img", { src, alt: `image ${part.width}x${part.height}`, loading: "lazy" }),
    el("figcaption", { class: "caption" }, `image ${part.width}x${part.height}`));
}

function toolCallNode(part) {
  if (part.error) {
    return el("div", { class: "tool-call bad" }, el("span", { class: "label" }, "bad tool call"), part.error,
      el("pre", {}, part.raw || ""));
  }
  return el("div", { class: "tool-call" }, el("span", { class: "label" }, "tool call"),
    el("code", {}, part.name), "(", el("code", {}, JSON.stringify(part.arguments)), ")");
}

function textOf(message, text) {
  if (message.role !== "tool") return text;
  return text.replace(/^\s*<tool_response>\s*/, "").replace(/\s*<\/tool_response>\s*$/, "");
}

function messageNode(message) {
  const label = message.role === "tool" ? `tool response${message.name ? " · " + message.name : ""}` : message.role;
  const hasMedia = message.parts.some((p) => !["text", "tool_call"].includes(p.type));
  const body = message.parts.map((p) => {
    if (p.type === "text") {
      const text = textOf(message, p.text);
      if (!text.trim()) return null;
      // a short label beside media (a keyframe's time) stays on the media's line
      if (hasMedia && text.trim().length <= 40 && !text.trim().includes("\n")) return el("span", { class: "label-text" }, text.trim());
      return el("pre", {}, text.replace(/^\n+/, ""));
    }
    if (p.type === "tool_call") return toolCallNode(p);
    return mediaNode(p);
  });
  const node = el("div", { class: `msg role-${message.role}` }, el("div", { class: "role" }, label), body);
  if (message.role === "system") {
    return el("details", { class: "system" }, el("summary", {}, "system prompt"), node);
  }
  return node;
}

function rolloutNode(r) {
  const masked = ["env_error", "engine_error", "judge_error"].includes(r.status);
  const breakdown = Object.entries(r.reward_breakdown || {}).map(([k, v]) => `${k} ${fmt(v, 2)}`).join(", ");
  const versions = r.policy_versions?.length ? `policy v${[...new Set(r.policy_versions)].join("/")}` : null;
  return el("article", { class: `rollout ${masked ? "masked" : r.status} kind-${r.kind}`, "data-index": r.index },
    el("header", {},
      el("b", {}, `${r.kind} #${r.index}`),
      el("span", { class: "reward" }, `reward ${fmt(r.reward)}`),
      breakdown ? el("span", { class: "fact" }, `(${breakdown})`) : null,
      el("span", { class: "fact" }, `status ${r.status}`),
      el("span", { class: "fact" }, `group ${r.group} · seed ${r.seed}`),
      versions ? el("span", { class: "fact" }, versions) : null,
      r.staleness !== null && r.staleness !== undefined ? el("span", { class: "fact" }, `staleness ${r.staleness}`) : null,
      el("span", { class: "fact" }, `${r.turns} turn(s) · ${r.prompt_tokens} prompt + ${r.completion_tokens} completion tokens`),
      el("span", { class: "fact" }, r.tools?.length ? `tools: ${r.tools.join(", ")} (${r.tool_calls} call(s))` : "no tool called")),
    r.error ? el("div", { class: "error" }, r.error) : null,
    r.agent ? agentNode(r.agent) : null,
    r.messages.map(messageNode));
}

// an agent program's episode: its exit, calls, the first refused request and what it wrote to stderr
function agentNode(a) {
  const exit = a.timed_out ? "timed out" : (a.exit_status !== undefined ? `exit status ${a.exit_status}` : null);
  return el("div", { class: "agent" },
    el("span", { class: "label" }, "agent program"),
    exit ? el("span", { class: "fact" }, exit) : null,
    a.model_calls !== undefined ? el("span", { class: "fact" }, `${a.model_calls} model call(s)`) : null,
    a.segments > 1 ? el("span", { class: "fact" }, `${a.segments} segments (history rewritten)`) : null,
    a.first_http_error ? el("div", { class: "error" }, `first refused request: ${a.first_http_error}`) : null,
    a.stderr_tail ? el("details", {}, el("summary", {}, "stderr (tail)"), el("pre", { class: "stderr" }, a.stderr_tail)) : null);
}

function filterQuery() {
  const q = new URLSearchParams();
  const put = (k, v) => { if (v !== "") q.set(k, v); };
  put("reward_min", $("#f-reward-min").value);
  put("reward_max", $("#f-reward-max").value);
  put("status", $("#f-status").value);
  put("tool", $("#f-tool").value);
  put("kind", $("#f-kind").value);
  return q.toString();
}

async function showStep(id, step) {
  const pane = $(`#pane-${id}`);
  if (id === "b" && pane.hidden) { $("#compare").checked = true; pane.hidden = false; }
  const known = state.steps.find((s) => s.step === step);
  state.panes[id] = { step, bytes: known ? known.bytes : 0, query: filterQuery() };
  $(".pane-step", pane).value = String(step);
  markSteps();
  const box = $(".rollouts", pane);
  let records;
  try {
    records = await getJSON(`/api/steps/${step}?${state.panes[id].query}`);
  } catch (err) {
    box.replaceChildren(el("div", { class: "none" }, String(err)));
    return;
  }
  $(".pane-count", pane).textContent = `${records.length} rollout(s)`;
  box.replaceChildren(...(records.length ? records.map(rolloutNode) : [el("div", { class: "none" }, "no rollout passes the filters")]));
}

function refreshPanes(force = false) {
  for (const id of ["a", "b"]) {
    const shown = state.panes[id];
    if (!shown || (id === "b" && $("#pane-b").hidden)) continue;
    const now = state.steps.find((s) => s.step === shown.step);
    if (force || (now && now.bytes !== shown.bytes)) showStep(id, shown.step);
  }
}

// -- polling ----------------------------------------------------------------------------------------------------------

async function poll() {
  try {
    const [run, steps, metrics] = await Promise.all([getJSON("/api/run"), getJSON("/api/steps"), getJSON("/api/metrics")]);
    document.title = `${run.name} · relax-gym`;
    $("#run-name").textContent = run.name;
    $("#run-facts").textContent = [run.env, run.algorithm, run.mode, run.steps ? `${run.steps} steps` : null].filter(Boolean).join(" · ");
    const badge = $("#run-state");
    badge.textContent = run.finished ? "finished" : "running (or stopped)";
    badge.classList.toggle("finished", run.finished);
    const metricsKey = `${metrics.length}:${JSON.stringify(metrics[metrics.length - 1] || {})}`;
    if (metricsKey !== state.metricsKey) { state.metricsKey = metricsKey; drawCharts(metrics); }
    const stepsKey = JSON.stringify(steps);
    if (stepsKey !== state.stepsKey) {
      state.stepsKey = stepsKey;
      state.steps = steps;
      drawSteps();
      if (!state.panes.a && steps.length) {
        const latest = [...steps].reverse().find((s) => s.train) || steps[steps.length - 1];
        await showStep("a", latest.step);
      } else {
        refreshPanes();
      }
    }
    document.body.dataset.loaded = "true";
  } catch (err) {
    $("#run-state").textContent = `cannot read the run: ${err.message}`;
  }
}

function schedule() {
  clearInterval(state.timer);
  if ($("#live").checked) state.timer = setInterval(poll, POLL_MS);
}

function init() {
  for (const id of ["f-reward-min", "f-reward-max", "f-status", "f-tool", "f-kind"]) {
    $("#" + id).addEventListener("change", () => refreshPanes(true));
  }
  $("#compare").addEventListener("change", (e) => {
    $("#pane-b").hidden = !e.target.checked;
    if (e.target.checked && !state.panes.b && state.steps.length) showStep("b", state.steps[0].step);
    markSteps();
  });
  for (const id of ["a", "b"]) {
    $(`#pane-${id} .pane-step`).addEventListener("change", (e) => showStep(id, Number(e.target.value)));
  }
  $("#live").addEventListener("change", schedule);
  poll();
  schedule();
}

init();
