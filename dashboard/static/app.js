// Claw-R1 dashboard: draws every panel from /v1/dashboard/*, refreshed when /v1/dashboard/live pushes a
// pulse (Server-Sent Events read through fetch, so an API key can ride along); curation posts feedback.
// Plain DOM + inline SVG, no external code. Text from the pool is only ever set as textContent.
"use strict";

const API = "v1/dashboard"; // relative to the page, so the dashboard also works behind a path prefix
const SVG_NS = "http://www.w3.org/2000/svg";
const PALETTE = ["#2f6fdd", "#2e8b57", "#d98a1c", "#8e44ad", "#c9362b", "#16a0a8", "#7f8c8d", "#b5651d",
  "#5d6dbe", "#9b9b2f"];
const CHANNEL_COLORS = { proxy: "#2f6fdd", gateway: "#2e8b57", service: "#d98a1c", other: "#7f8c8d" };
const KIND_CHANNEL = { blackbox_agent: "proxy", whitebox_agent: "gateway", blackbox_service: "service" };
const PAGE_SIZE = 25;

const state = {
  summary: null,
  timelineMode: "kind",
  filters: {},
  offset: 0,
  total: 0,
  openStep: null,
  busy: false,
  selected: new Set(),
  live: null, // the AbortController of the live stream; null while paused
  lagHistory: [], // [{t, groups: {name: behind_ready}}], newest last
  previewTimer: null,
};

// ---------- small DOM helpers ----------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "onclick") node.addEventListener("click", value);
    else if (key === "class") node.className = value;
    else node.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null) continue;
    if (key === "onclick") node.addEventListener("click", value);
    else node.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function mount(id, ...children) {
  document.getElementById(id).replaceChildren(...children.flat());
}

const empty = (text) => el("div", { class: "empty" }, text || "nothing yet");

// ---------- formatting ----------

function num(value, digits) {
  if (value === null || value === undefined) return "—";
  if (typeof value !== "number") return String(value);
  if (digits !== undefined) return value.toFixed(digits);
  if (Number.isInteger(value)) return value.toLocaleString("en-US");
  return Math.abs(value) >= 100 ? value.toFixed(1) : String(Number(value.toPrecision(3)));
}

function pct(part, whole) {
  return whole ? `${((100 * part) / whole).toFixed(1)}%` : "—";
}

function time(ms) {
  if (!ms) return "—";
  const d = new Date(ms);
  return d.toLocaleString("en-GB", { hour12: false });
}

function clock(ms) {
  return new Date(ms).toLocaleTimeString("en-GB", { hour12: false });
}

function bucketLabel(ms, widthMs) {
  return widthMs >= 86400000 ? new Date(ms).toLocaleDateString("en-GB") : clock(ms);
}

function age(ms) {
  if (!ms) return "—";
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.round(s / 60)}m ago`;
  if (s < 86400) return `${Math.round(s / 3600)}h ago`;
  return `${Math.round(s / 86400)}d ago`;
}

function version(v) {
  return v === null || v === undefined ? "none" : `v${v}`;
}

function color(i) {
  return PALETTE[i % PALETTE.length];
}

function tag(text, kind) {
  return el("span", { class: `tag ${kind || ""}` }, text);
}

function statusTag(step) {
  return step.status === "failed" ? tag("failed", "bad") : tag("ok", "good");
}

// ---------- tables ----------

// columns: [{label, value: row => text|Node, num: bool}]; onRow: row => void makes rows clickable.
function table(rows, columns, onRow) {
  if (!rows || rows.length === 0) return empty();
  const head = el("tr", {}, columns.map((c) => el("th", { class: c.num ? "num" : "" }, c.label)));
  const body = rows.map((row) => {
    const cells = columns.map((c) => {
      const value = c.value(row);
      const text = value instanceof Node ? "" : String(value ?? "—");
      return el("td", { class: c.num ? "num" : "", title: text || null }, value instanceof Node ? value : text);
    });
    return el("tr", { class: onRow ? "click" : "", onclick: onRow ? () => onRow(row) : null }, cells);
  });
  return el("div", { class: "table-wrap" }, el("table", {}, el("thead", {}, head), el("tbody", {}, body)));
}

function stats(items) {
  return el("div", { class: "stats" },
    items.map(([label, value]) => el("div", { class: "stat" }, el("b", {}, value), el("span", {}, label))));
}

// ---------- charts (inline SVG) ----------

// Horizontal bars: items [{label, value, color, title, onClick}].
function bars(items, opts = {}) {
  if (!items.length) return empty();
  const width = 300, row = 20, labelW = opts.labelWidth || 110;
  const max = Math.max(1, ...items.map((i) => i.value));
  const chart = svg("svg", { viewBox: `0 0 ${width} ${items.length * row}`, width: "100%", role: "img" });
  items.forEach((item, i) => {
    const y = i * row;
    const w = ((width - labelW - 60) * item.value) / max;
    const group = svg("g", { class: item.onClick ? "clickable" : null, onclick: item.onClick || null },
      svg("title", {}, item.title || `${item.label}: ${num(item.value)}`),
      svg("text", { x: 0, y: y + 14 }, item.label.length > 18 ? `${item.label.slice(0, 17)}…` : item.label),
      svg("rect", { x: labelW, y: y + 4, width: Math.max(w, item.value ? 1 : 0), height: row - 8,
        fill: item.color || PALETTE[0], rx: 2 }),
      svg("text", { x: labelW + w + 4, y: y + 14 }, item.text || num(item.value)));
    chart.append(group);
  });
  return chart;
}

// Stacked columns: labels [x labels], series [{name, color, values}].
function columns(labels, series, opts = {}) {
  if (!labels.length) return empty();
  const width = 600, height = opts.height || 150, left = 34, bottom = 18, top = 6;
  const totals = labels.map((_, i) => series.reduce((s, ser) => s + (ser.values[i] || 0), 0));
  const max = Math.max(1, ...totals);
  const plotW = width - left - 4, plotH = height - bottom - top;
  const slot = plotW / labels.length, barW = Math.max(1, slot * 0.8);
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, width: "100%", role: "img" });
  chart.append(
    svg("line", { x1: left, y1: top + plotH, x2: width, y2: top + plotH, stroke: "#ccd" }),
    svg("text", { x: left - 4, y: top + 8, "text-anchor": "end" }, num(max)),
    svg("text", { x: left - 4, y: top + plotH, "text-anchor": "end" }, "0"));
  labels.forEach((label, i) => {
    let y = top + plotH;
    const x = left + i * slot + (slot - barW) / 2;
    for (const ser of series) {
      const value = ser.values[i] || 0;
      if (!value) continue;
      const h = (plotH * value) / max;
      y -= h;
      chart.append(svg("rect", { x, y, width: barW, height: h, fill: ser.color },
        svg("title", {}, `${label} · ${ser.name}: ${num(value)}`)));
    }
    if (opts.marks && opts.marks[i]) {
      chart.append(svg("circle", { cx: x + barW / 2, cy: top + 3, r: 2.5, fill: "#c9362b" },
        svg("title", {}, `${label}: ${num(opts.marks[i])} failed`)));
    }
  });
  const every = Math.max(1, Math.ceil(labels.length / 6));
  labels.forEach((label, i) => {
    if (i % every === 0) {
      chart.append(svg("text", { x: left + i * slot + slot / 2, y: height - 4, "text-anchor": "middle" }, label));
    }
  });
  return chart;
}

// One 100% stacked bar: parts [{label, value, color, onClick}].
function stackBar(parts) {
  const total = parts.reduce((s, p) => s + p.value, 0);
  const chart = svg("svg", { viewBox: "0 0 300 18", width: "100%", role: "img" });
  let x = 0;
  for (const part of parts) {
    const w = total ? (300 * part.value) / total : 0;
    if (w > 0) {
      chart.append(svg("rect", { x, y: 0, width: w, height: 18, fill: part.color,
        class: part.onClick ? "clickable" : null, onclick: part.onClick || null },
      svg("title", {}, `${part.label}: ${num(part.value)} (${pct(part.value, total)})`)));
    }
    x += w;
  }
  if (!total) chart.append(svg("rect", { x: 0, y: 0, width: 300, height: 18, fill: "#eef0f4" }));
  const legend = el("div", { class: "legend" }, parts.map((p) =>
    el("span", { class: p.onClick ? "click" : "", onclick: p.onClick || null },
      el("i", { style: `background:${p.color}` }), `${p.label} ${num(p.value)} (${pct(p.value, total)})`)));
  return [chart, legend];
}

function legend(series) {
  return el("div", { class: "legend" },
    series.map((s) => el("span", {}, el("i", { style: `background:${s.color}` }), s.name)));
}

// ---------- filters and the latest-steps table ----------

function setFilter(changes) {
  state.filters = { ...state.filters, ...changes };
  for (const [k, v] of Object.entries(state.filters)) if (v === null || v === undefined) delete state.filters[k];
  state.offset = 0;
  loadSteps();
  document.getElementById("latest").scrollIntoView({ behavior: "smooth" });
}

function renderFilters() {
  document.getElementById("data-channel").value = state.filters.channel || "";
  const entries = Object.entries(state.filters);
  mount("filters", entries.length
    ? entries.map(([k, v]) => el("button", { type: "button", title: "remove filter",
      onclick: () => { delete state.filters[k]; state.offset = 0; loadSteps(); } }, `${k} = ${v} ×`))
    : el("span", { class: "muted" }, "no filters: click a source, group, provenance or trajectory to filter"));
}

async function loadSteps() {
  const params = new URLSearchParams({ limit: PAGE_SIZE, offset: state.offset, ...state.filters });
  try {
    const page = await getJson(`${API}/steps?${params}`);
    state.total = page.total;
    renderFilters();
    mount("steps", table(page.steps, [
      { label: "", value: (s) => {
        const box = el("input", { type: "checkbox", class: "pick", "data-step": s.step_id,
          title: "select for curation" });
        box.checked = state.selected.has(s.step_id);
        box.addEventListener("click", (e) => {
          e.stopPropagation();
          if (box.checked) state.selected.add(s.step_id); else state.selected.delete(s.step_id);
          document.getElementById("selected-count").textContent = `${state.selected.size} selected`;
        });
        return box;
      } },
      { label: "created", value: (s) => time(s.created_ms) },
      { label: "step", value: (s) => s.step_id },
      { label: "trajectory", value: (s) => el("a", { class: "link", onclick: (e) => {
        e.stopPropagation(); setFilter({ trajectory_id: s.trajectory_id });
      } }, s.trajectory_id) },
      { label: "#", value: (s) => s.step_index, num: true },
      { label: "source", value: (s) => `${KIND_CHANNEL[s.source_kind] || s.source_kind}/${s.source_name}` },
      { label: "model", value: (s) => s.model },
      { label: "policy", value: (s) => version(s.policy_version) },
      { label: "status", value: statusTag },
      { label: "tokens p/r", value: (s) => `${s.prompt_tokens}/${s.response_tokens}`, num: true },
      { label: "provenance", value: (s) => s.token_provenance },
      { label: "reward", value: (s) => num(s.reward), num: true },
      { label: "reward status", value: (s) => tag(s.reward_status, s.reward_status === "final" ? "good" : "warn") },
      { label: "ready", value: (s) => (s.ready ? tag("ready", "good") : tag("not ready")) },
      { label: "labels", value: (s) => s.quality_labels.join(", ") },
      { label: "v", value: (s) => s.version, num: true },
    ], (s) => openStep(s.step_id)));
    const last = Math.min(state.offset + PAGE_SIZE, state.total);
    document.getElementById("page").textContent =
      state.total ? `${state.offset + 1}–${last} of ${num(state.total)}` : "0 steps";
    document.getElementById("prev").disabled = state.offset === 0;
    document.getElementById("next").disabled = last >= state.total;
  } catch (err) {
    showError(err);
  }
}

// ---------- one step's detail ----------

function kv(pairs) {
  return el("dl", { class: "kv" }, pairs.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v ?? "—")]));
}

function pre(value) {
  return el("pre", {}, typeof value === "string" ? value : JSON.stringify(value, null, 2));
}

function messageContent(content) {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content.map((part) => (part && typeof part.text === "string" ? part.text : JSON.stringify(part)))
      .join("\n");
  }
  return JSON.stringify(content, null, 2);
}

function messages(prompt) {
  const list = Array.isArray(prompt) ? prompt : prompt && Array.isArray(prompt.messages) ? prompt.messages : null;
  if (!list) return pre(prompt || "");
  return list.map((m) => el("div", { class: "message" },
    el("div", { class: "role" }, m.role || "?", m.name ? ` (${m.name})` : ""),
    el("pre", {}, messageContent(m.content ?? ""),
      m.tool_calls ? `\n${JSON.stringify(m.tool_calls, null, 2)}` : "")));
}

async function openStep(stepId) {
  state.openStep = stepId;
  history.replaceState(null, "", `#step=${encodeURIComponent(stepId)}`);
  const panel = document.getElementById("detail");
  panel.hidden = false;
  document.getElementById("detail-title").textContent = stepId;
  try {
    renderStep(await getJson(`${API}/steps/${encodeURIComponent(stepId)}`));
  } catch (err) {
    mount("detail-body", el("div", { class: "error" }, String(err.message || err)));
  }
}

function closeStep() {
  state.openStep = null;
  document.getElementById("detail").hidden = true;
  history.replaceState(null, "", location.pathname + location.search);
}

// Response tokens as a strip, each cell coloured by its logprob (darker = less likely).
function heatStrip(ids, logprobs) {
  if (!ids || !ids.length) return [];
  const cells = ids.map((id, k) => {
    const lp = logprobs && k < logprobs.length ? logprobs[k] : null;
    const p = lp === null ? null : Math.exp(lp);
    const style = p === null ? "background:#ddd" : `background:hsl(${Math.round(120 * p)},65%,${40 + 20 * p}%)`;
    const text = id < 256 && id >= 32 ? `'${String.fromCharCode(id)}'` : `#${id}`;
    return el("i", { style, title: `${text} logprob ${lp === null ? "—" : lp.toFixed(3)}` });
  });
  return [el("div", { class: "muted" }, "response tokens by probability (hover for id and logprob)"),
    el("div", { class: "heat", id: "heat" }, cells)];
}

function curateStepForm(stepId) {
  const exclude = el("input", { type: "checkbox", id: "step-exclude" });
  const label = el("input", { id: "step-label", size: 12, placeholder: "label" });
  const note = el("input", { id: "step-note", size: 20, placeholder: "note" });
  const result = el("span", { class: "muted", id: "step-curate-result" });
  const apply = el("button", { type: "button", id: "step-curate" }, "apply");
  apply.addEventListener("click", async () => {
    const body = { step_ids: [stepId] };
    if (exclude.checked) body.exclude = true;
    if (label.value.trim()) body.labels = [label.value.trim()];
    if (note.value.trim()) body.note = note.value.trim();
    result.textContent = await curate(body);
  });
  return el("div", { class: "inline-form curate-step" },
    el("label", {}, exclude, " exclude from training"), label, note, apply, result);
}

async function curate(body) {
  try {
    const reply = await sendJson(`${API}/curate`, body);
    return `curated ${reply.steps} step(s): ${reply.accepted} feedback record(s) sent`;
  } catch (err) {
    return `curation failed: ${err.message || err}`;
  }
}

function curationFromForm() {
  const body = {};
  const labels = document.getElementById("curate-labels").value.split(",").map((l) => l.trim()).filter(Boolean);
  if (labels.length) body.labels = labels;
  const quality = document.getElementById("curate-quality").value;
  if (quality) body.quality = quality;
  if (document.getElementById("curate-untrainable").checked) body.trainable = false;
  if (document.getElementById("curate-exclude").checked) body.exclude = true;
  const note = document.getElementById("curate-note").value.trim();
  if (note) body.note = note;
  return body;
}

async function curateFromBar(target) {
  const out = document.getElementById("curate-result");
  out.textContent = await curate({ ...curationFromForm(), ...target });
  state.selected.clear();
  document.getElementById("selected-count").textContent = "0 selected";
}

function renderStep(detail) {
  const s = detail.step;
  const logprobMean = s.logprob_count ? s.logprob_sum / s.logprob_count : null;
  mount("detail-body",
    el("h4", {}, "identity"),
    kv([
      ["trajectory", el("a", { class: "link", onclick: () => setFilter({ trajectory_id: s.trajectory_id }) },
        s.trajectory_id)],
      ["step index", s.step_index], ["parent step", s.parent_step_id],
      ["prompt group", s.prompt_group_id ? `${s.prompt_group_id} (size ${s.prompt_group_size ?? "?"})` : null],
      ["prompt id", s.prompt_id], ["response id", s.response_id], ["version", s.version],
      ["link status", tag(s.link_status, s.link_status === "superseded" ? "bad"
        : s.link_status === "ambiguous" ? "warn" : "good")],
      ["link candidate", s.link_candidate_step_id ? el("a", { class: "link",
        onclick: () => openStep(s.link_candidate_step_id) }, s.link_candidate_step_id) : null],
      ["data channel", s.channel],
    ]),
    el("h4", {}, "curate this step"),
    curateStepForm(s.step_id),
    el("h4", {}, "provenance"),
    kv([
      ["source", `${s.source_kind} · ${s.source_name} (${KIND_CHANNEL[s.source_kind] || "other"})`],
      ["agent", s.agent], ["model", s.model], ["policy version", version(s.policy_version)],
      ["created", time(s.created_ms)], ["ingested", time(s.ingested_ms)], ["updated", time(s.updated_ms)],
      ["latency", s.latency_ms === null ? null : `${s.latency_ms} ms`], ["status", statusTag(s)],
      ["error", s.error], ["sampling", JSON.stringify(s.sampling_params)],
    ]),
    el("h4", {}, "tokens"),
    kv([
      ["prompt / response ids", `${s.prompt_tokens} / ${s.response_tokens}`],
      ["usage prompt / completion", `${s.usage_prompt_tokens ?? "—"} / ${s.usage_completion_tokens ?? "—"}`],
      ["provenance", s.token_provenance], ["tokenizer", s.tokenizer],
      ["logprobs", s.logprob_count ? `${s.logprob_count}, mean ${num(logprobMean)}` : "none"],
    ]),
    heatStrip(s.response_token_ids, s.response_logprobs),
    el("h4", {}, "reward and curation"),
    kv([
      ["reward", `${num(s.reward)} (${s.reward_status}${s.reward_source ? `, ${s.reward_source}` : ""})`],
      ["components", Object.keys(s.reward_components || {}).length ? JSON.stringify(s.reward_components) : null],
      ["trajectory reward", `${num(s.trajectory_reward)} (${s.trajectory_reward_status})`],
      ["terminal", s.terminal ? "yes" : "no"], ["ready", s.ready ? tag("ready", "good") : tag("not ready")],
      ["quality", `${s.quality_labels.join(", ") || "no labels"}; score ${num(s.quality_score)}`],
    ]),
    el("h4", {}, "prompt messages"),
    messages(s.prompt_messages),
    el("h4", {}, "response"),
    pre(s.response_text || ""),
    Array.isArray(s.tool_calls) && s.tool_calls.length ? [el("h4", {}, "tool calls"), pre(s.tool_calls)] : [],
    el("h4", {}, "feedback"),
    table(detail.feedback_records, [
      { label: "received", value: (f) => time(f.received_ms) },
      { label: "on", value: (f) => f.target_kind },
      { label: "source", value: (f) => `${f.source}/${f.source_name}` },
      { label: "reward", value: (f) => num(f.reward), num: true },
      { label: "final", value: (f) => (f.final ? "yes" : "no") },
      { label: "label", value: (f) => f.label },
      { label: "comment", value: (f) => f.comment },
      { label: "correction", value: (f) => f.correction },
    ]),
    Array.isArray(s.feedback) && s.feedback.length ? pre(s.feedback) : [],
    el("h4", {}, "prefix-merge scopes"),
    table(detail.prefix_scopes, [
      { label: "kind", value: (p) => p.scope_kind },
      { label: "scope", value: (p) => p.scope_id },
      { label: "total", value: (p) => num(p.total_tokens), num: true },
      { label: "tree", value: (p) => num(p.tree_tokens), num: true },
      { label: "ratio", value: (p) => `${num(p.savings_ratio, 2)}×`, num: true },
      { label: "forks", value: (p) => p.forks, num: true },
    ]),
    el("h4", {}, "trajectory"),
    table(detail.trajectory_steps, [
      { label: "#", value: (t) => t.step_index, num: true },
      { label: "step", value: (t) => (t.step_id === s.step_id ? `▶ ${t.step_id}` : t.step_id) },
      { label: "status", value: statusTag },
      { label: "reward", value: (t) => num(t.reward), num: true },
      { label: "reward status", value: (t) => t.reward_status },
      { label: "ready", value: (t) => (t.ready ? "yes" : "no") },
    ], (t) => openStep(t.step_id)),
    el("h4", {}, "metadata"),
    pre(s.metadata));
}

// ---------- panels ----------

function renderHeadline(t, collection) {
  const figures = [
    ["steps", num(t.steps)], ["ready", pct(t.ready_steps, t.steps)], ["failed", num(t.failed_steps)],
    ["trajectories", num(t.trajectories)], ["prompt groups", num(t.prompt_groups)],
    ["dead letters", num(t.dead_letters)], ["prefix savings", `${num(t.savings_ratio, 2)}×`],
    ["consumer groups", num(t.consumer_groups)], ["last step", age(collection.last_step_ms)],
  ];
  mount("headline", figures.map(([label, value]) =>
    el("div", { class: "figure" }, el("b", {}, value), el("span", {}, label))));
}

function renderCollection(c) {
  mount("channels", bars(c.channels.map((ch) => ({
    label: ch.channel, value: ch.steps, color: CHANNEL_COLORS[ch.channel] || CHANNEL_COLORS.other,
    text: `${num(ch.steps)}${ch.failed ? ` (${num(ch.failed)} failed)` : ""}`,
  }))), legend(c.channels.map((ch) => ({ name: `${ch.channel}: ${channelKinds(ch.channel)}`,
    color: CHANNEL_COLORS[ch.channel] || CHANNEL_COLORS.other }))));

  const tl = c.timeline;
  const byKind = state.timelineMode === "kind";
  const rows = byKind ? tl.by_kind : tl.by_source;
  const series = rows.map((r, i) => ({
    name: byKind ? `${r.source_kind} (${r.channel})` : `${r.source_kind}/${r.source_name}`,
    color: byKind ? CHANNEL_COLORS[r.channel] || color(i) : color(i), values: r.steps,
  }));
  const failed = tl.buckets.map((_, i) => rows.reduce((s, r) => s + r.failed[i], 0));
  const width = tl.bucket_ms >= 86400000 ? "day" : tl.bucket_ms >= 3600000 ? `${tl.bucket_ms / 3600000} h`
    : tl.bucket_ms >= 60000 ? `${tl.bucket_ms / 60000} min` : `${tl.bucket_ms / 1000} s`;
  mount("timeline", tl.buckets.length
    ? [columns(tl.buckets.map((b) => bucketLabel(b, tl.bucket_ms)), series, { marks: failed }), legend(series),
      el("div", { class: "muted" }, `buckets of ${width}; red dots: failed calls`)]
    : empty());

  mount("sources", table(c.sources, [
    { label: "channel", value: (r) => r.channel },
    { label: "source kind", value: (r) => r.source_kind },
    { label: "source name", value: (r) => r.source_name || "(unnamed)" },
    { label: "steps", value: (r) => num(r.steps), num: true },
    { label: "failed", value: (r) => num(r.failed), num: true },
    { label: "mean latency", value: (r) => (r.mean_latency_ms === null ? "—" : `${num(r.mean_latency_ms)} ms`),
      num: true },
    { label: "last step", value: (r) => age(r.last_step_ms) },
  ], (r) => setFilter({ source_kind: r.source_kind, source_name: r.source_name })));

  mount("failures", table(c.recent_failures, [
    { label: "when", value: (r) => time(r.created_ms) },
    { label: "source", value: (r) => `${r.source_kind}/${r.source_name}` },
    { label: "error", value: (r) => r.error },
  ], (r) => openStep(r.step_id)));
}

function channelKinds(channel) {
  return Object.entries(KIND_CHANNEL).filter(([, ch]) => ch === channel).map(([k]) => k).join(", ") || "other";
}

function renderRepresentation(r) {
  const t = r.trajectories;
  mount("trajectories", stats([
    ["trajectories", num(t.trajectories)], ["steps", num(t.steps)],
    ["mean steps", t.trajectories ? num(t.mean_steps, 2) : "—"], ["longest", num(t.max_steps)],
    ["terminal", num(t.terminal_trajectories)], ["all steps ready", num(t.ready_trajectories)],
  ]));
  mount("steps-per-trajectory", r.steps_per_trajectory.length
    ? [columns(r.steps_per_trajectory.map((row) => String(row.num_steps)),
      [{ name: "trajectories", color: PALETTE[0], values: r.steps_per_trajectory.map((row) => row.trajectories) }],
      { height: 120 }), el("div", { class: "muted" }, "x: steps in a trajectory; y: trajectories")]
    : empty());
  const provColors = { engine: "#2e8b57", retokenized: "#d98a1c", none: "#9aa1ad" };
  mount("provenance",
    stackBar(r.provenance.map((p, i) => ({ label: p.token_provenance, value: p.steps,
      color: provColors[p.token_provenance] || color(i + 3),
      onClick: () => setFilter({ token_provenance: p.token_provenance }) }))),
    table(r.provenance, [
      { label: "provenance", value: (p) => p.token_provenance },
      { label: "steps", value: (p) => num(p.steps), num: true },
      { label: "prompt tokens", value: (p) => num(p.prompt_tokens), num: true },
      { label: "response tokens", value: (p) => num(p.response_tokens), num: true },
    ]));
  const g = r.prompt_groups;
  mount("prompt-groups",
    stats([["groups", num(g.groups)], ["complete", num(g.complete)], ["steps without a group", num(g.ungrouped_steps)]]),
    table(g.latest, [
      { label: "group", value: (x) => x.prompt_group_id },
      { label: "size", value: (x) => num(x.group_size), num: true },
      { label: "trajectories", value: (x) => num(x.num_trajectories), num: true },
      { label: "steps", value: (x) => num(x.num_steps), num: true },
      { label: "prompts", value: (x) => num(x.distinct_prompts), num: true },
      { label: "mean reward", value: (x) => num(x.mean_reward), num: true },
      { label: "reward std", value: (x) => num(x.reward_std), num: true },
      { label: "final rewards", value: (x) => num(x.final_rewards), num: true },
      { label: "ready", value: (x) => (x.all_ready ? tag("ready", "good") : tag("not ready")) },
      { label: "started", value: (x) => time(x.started_at_ms) },
    ], (x) => setFilter({ prompt_group_id: x.prompt_group_id })));
}

function renderCuration(c) {
  const t = c.totals;
  mount("readiness",
    el("div", { class: "muted" }, "readiness"),
    stackBar([
      { label: "ready", value: t.ready_steps, color: "#2e8b57", onClick: () => setFilter({ ready: true }) },
      { label: "not ready", value: t.steps - t.ready_steps, color: "#9aa1ad",
        onClick: () => setFilter({ ready: false }) },
    ]),
    el("div", { class: "muted" }, "reward status"),
    stackBar([
      { label: "final", value: t.reward_final, color: "#2f6fdd", onClick: () => setFilter({ reward_status: "final" }) },
      { label: "pending", value: t.reward_pending, color: "#d98a1c",
        onClick: () => setFilter({ reward_status: "pending" }) },
    ]),
    stats([["with a reward", num(t.rewarded)], ["failed", num(t.failed)], ["quality scored", num(t.scored)],
      ["mean quality score", num(t.mean_quality_score)]]));

  const h = c.reward_histogram;
  const hist = h.versions.length
    ? el("div", {}, h.versions.map((v, i) => el("div", {},
      el("div", { class: "muted" }, `${version(v.policy_version)} · ${num(v.counts.reduce((a, b) => a + b, 0))} rewarded`),
      columns(h.edges.slice(0, -1).map((e, j) => `${num(e)}…${num(h.edges[j + 1])}`),
        [{ name: version(v.policy_version), color: color(i), values: v.counts }], { height: 70 }))),
    el("div", { class: "muted" }, `reward from ${num(h.low)} to ${num(h.high)} in ${h.bins} bins`))
    : empty("no rewards yet");
  mount("rewards", table(c.reward_by_version, [
    { label: "policy", value: (v) => version(v.policy_version) },
    { label: "steps", value: (v) => num(v.steps), num: true },
    { label: "rewarded", value: (v) => num(v.rewarded), num: true },
    { label: "final", value: (v) => num(v.final_rewards), num: true },
    { label: "ready", value: (v) => num(v.ready_steps), num: true },
    { label: "mean", value: (v) => num(v.mean_reward), num: true },
    { label: "min", value: (v) => num(v.min_reward), num: true },
    { label: "max", value: (v) => num(v.max_reward), num: true },
  ], (v) => (v.policy_version === null ? null : setFilter({ policy_version: v.policy_version }))), hist);

  mount("labels", bars(c.quality_labels.map((l, i) => ({ label: l.label, value: l.steps, color: color(i) }))));
  mount("feedback", table(c.feedback, [
    { label: "source", value: (f) => f.source || "(none)" },
    { label: "on", value: (f) => f.target_kind },
    { label: "items", value: (f) => num(f.items), num: true },
    { label: "rewards", value: (f) => num(f.rewards), num: true },
    { label: "final", value: (f) => num(f.final_items), num: true },
    { label: "labels", value: (f) => num(f.labelled), num: true },
    { label: "corrections", value: (f) => num(f.corrections), num: true },
  ]));
  const d = c.dead_letters;
  mount("dead-letters", stats([["dead letters", num(d.total)]]), table(d.by_reason, [
    { label: "stage", value: (x) => x.stage },
    { label: "reason", value: (x) => x.reason },
    { label: "letters", value: (x) => num(x.letters), num: true },
    { label: "last", value: (x) => age(x.last_failed_ms) },
  ]));
}

function renderOptimization(o) {
  const all = o.overall;
  mount("savings",
    stats([["ratio", `${num(all.savings_ratio, 2)}×`], ["saved tokens", num(all.saved_tokens)],
      ["scopes", num(all.scopes)], ["forks", num(all.forks)]]),
    bars([
      { label: "total tokens", value: all.total_tokens, color: "#9aa1ad" },
      { label: "tree tokens", value: all.tree_tokens, color: "#2e8b57" },
    ]),
    table(o.by_kind, [
      { label: "scope kind", value: (k) => k.scope_kind },
      { label: "scopes", value: (k) => num(k.scopes), num: true },
      { label: "total", value: (k) => num(k.total_tokens), num: true },
      { label: "tree", value: (k) => num(k.tree_tokens), num: true },
      { label: "ratio", value: (k) => `${num(k.savings_ratio, 2)}×`, num: true },
      { label: "forks", value: (k) => num(k.forks), num: true },
    ]));
  mount("scopes", table(o.scopes, [
    { label: "kind", value: (s) => s.scope_kind },
    { label: "scope", value: (s) => s.scope_id },
    { label: "total", value: (s) => num(s.total_tokens), num: true },
    { label: "tree", value: (s) => num(s.tree_tokens), num: true },
    { label: "saved", value: (s) => num(s.saved_tokens), num: true },
    { label: "ratio", value: (s) => `${num(s.savings_ratio, 2)}×`, num: true },
    { label: "forks", value: (s) => num(s.forks), num: true },
    { label: "nodes", value: (s) => num(s.num_nodes), num: true },
  ], (s) => openTree(s.scope_kind, s.scope_id)));
}

// ---------- prefix tree view ----------

async function openTree(kind, id) {
  document.getElementById("tree").hidden = false;
  document.getElementById("tree-title").textContent = `${kind} ${id}`;
  try {
    const params = new URLSearchParams({ scope_kind: kind, scope_id: id });
    renderTree(await getJson(`${API}/tree?${params}`));
  } catch (err) {
    mount("tree-body", el("div", { class: "error" }, String(err.message || err)));
  }
}

function renderTree(t) {
  const p = t.packed;
  const children = {};
  const known = new Set(t.nodes.map((n) => n.node_id));
  for (const n of t.nodes) (children[known.has(n.parent_node_id) ? n.parent_node_id : ""] ||= []).push(n);
  const rows = [];
  const walk = (parent, depth) => {
    for (const n of children[parent] || []) {
      rows.push(el("div", { class: "tree-node", style: `padding-left:${depth * 14}px`,
        title: `tokens from ${n.depth_start}: ${n.head.join(" ")}…` },
      `${depth ? "└ " : ""}${n.tokens} tokens @${n.depth_start}`,
      n.step_ids.length ? el("span", { class: "muted" }, `  ends ${n.step_ids.join(", ")}`) : ""));
      walk(n.node_id, depth + 1);
    }
  };
  walk("", 0);
  const most = Math.max(1, ...p.ribbon.map((r) => r.shared));
  const ribbon = el("div", { class: "ribbon", id: "ribbon" }, p.ribbon.map((r) => el("i", {
    style: `width:${(100 * (r.end - r.start)) / Math.max(1, p.num_tokens)}%;` +
      `background:hsl(215,70%,${85 - (45 * r.shared) / most}%)`,
    title: `tokens ${r.start}–${r.end - 1}: shared by ${r.shared} step(s)` })));
  const n = p.mask.length;
  const cell = n ? 240 / n : 0;
  const mask = svg("svg", { width: 240, height: 240, id: "mask", viewBox: "0 0 240 240" },
    p.mask.flatMap((row, i) => row.map((v, j) => (v > 0 ? svg("rect", { x: j * cell, y: i * cell,
      width: cell, height: cell, fill: "#2f6fdd", "fill-opacity": Math.max(0.15, v) }) : null))));
  mount("tree-body",
    el("h4", {}, "savings"),
    stats([["steps", num(p.steps)], ["sequence tokens", num(p.total_tokens)], ["packed tokens", num(p.tree_tokens)],
      ["saved", num(p.saved_tokens)], ["ratio", `${num(p.savings_ratio, 2)}×`], ["forks", num(p.forks)]]),
    el("h4", {}, "packed ribbon (darker = shared by more steps)"), ribbon,
    el("h4", {}, "attention mask (packed, thumbnail)"), mask,
    el("h4", {}, `tree (${t.nodes.length} nodes, as merged by the streams)`),
    rows.length ? rows : empty("no nodes stored for this scope yet"));
}

function closeTree() {
  document.getElementById("tree").hidden = true;
}

// ---------- trainer preview, drift and lag ----------

async function loadPreview() {
  const params = new URLSearchParams({
    group: document.getElementById("preview-group").value.trim() || "preview",
    whole_groups: document.getElementById("preview-whole").checked,
  });
  const preset = document.getElementById("preview-preset").value.trim();
  if (preset) params.set("preset", preset);
  const groups = document.getElementById("preview-groups").value;
  if (groups && params.get("whole_groups") === "true") params.set("max_groups", groups);
  const trainerVersion = document.getElementById("preview-version").value;
  if (trainerVersion) params.set("policy_version", trainerVersion);
  try {
    const b = await getJson(`${API}/preview?${params}`);
    mount("preview", stats([["steps", num(b.steps)], ["groups", num(b.groups)],
      ["prompt tokens", num(b.prompt_tokens)], ["response tokens", num(b.response_tokens)],
      ["packed tokens", num(b.packed.tree_tokens)], ["packing saves", `${num(b.packed.savings_ratio, 2)}×`]]),
    table(b.rows, [
      { label: "step", value: (r) => el("span", { class: "preview-step" }, r.step_id) },
      { label: "group", value: (r) => r.prompt_group_id },
      { label: "#", value: (r) => r.step_index, num: true },
      { label: "policy", value: (r) => version(r.policy_version) },
      { label: "reward", value: (r) => num(r.reward), num: true },
      { label: "tokens p/r", value: (r) => `${r.prompt_tokens}/${r.response_tokens}`, num: true },
      { label: "labels", value: (r) => r.quality_labels.join(", ") },
    ], (r) => openStep(r.step_id)));
  } catch (err) {
    mount("preview", el("div", { class: "error" }, String(err.message || err)));
  }
}

function renderDrift(rows) {
  const series = [
    { name: "consumed", color: color(1), values: rows.map((r) => r.consumed) },
    { name: "ready, not consumed", color: color(0), values: rows.map((r) => Math.max(0, r.ready_steps - r.consumed)) },
    { name: "not ready", color: "#c5cbd6", values: rows.map((r) => Math.max(0, r.steps - r.ready_steps)) },
  ];
  mount("drift", rows.length ? [columns(rows.map((r) => version(r.policy_version)), series), legend(series)]
    : empty("no policy versions reported yet"));
}

function renderLag(groups) {
  const now = Date.now();
  state.lagHistory.push({ t: now, groups: Object.fromEntries(groups.map((g) => [g.group_name, g.behind_ready || 0])) });
  state.lagHistory = state.lagHistory.filter((h) => now - h.t < 10 * 60 * 1000).slice(-120);
  const names = groups.map((g) => g.group_name);
  if (!names.length || state.lagHistory.length < 1) { mount("lag", empty("no consumer groups yet")); return; }
  const max = Math.max(1, ...state.lagHistory.flatMap((h) => Object.values(h.groups)));
  const w = 300, h = 90, n = state.lagHistory.length;
  const x = (i) => (n === 1 ? w : (i * w) / (n - 1));
  const lines = names.map((name, k) => svg("polyline", { fill: "none", stroke: color(k), "stroke-width": 2,
    points: state.lagHistory.map((p, i) => `${x(i).toFixed(1)},${(h - ((p.groups[name] || 0) * h) / max).toFixed(1)}`)
      .join(" ") }));
  mount("lag", svg("svg", { width: "100%", height: h + 14, viewBox: `0 0 ${w} ${h + 14}`, preserveAspectRatio: "none" },
    lines, svg("text", { x: 2, y: h + 12 }, `max ${max} ready steps behind`)),
  legend(names.map((name, k) => ({ name: `${name}: ${state.lagHistory[n - 1].groups[name]}`, color: color(k) }))));
}

function renderConsumption(c) {
  renderDrift(c.policy_drift);
  renderLag(c.groups);
  mount("groups", table(c.groups, [
    { label: "group", value: (g) => g.group_name },
    { label: "epoch", value: (g) => g.epoch || "(initial)" },
    { label: "floor", value: (g) => (g.floor_ms ? time(g.floor_ms) : "start") },
    { label: "committed", value: (g) => num(g.committed), num: true },
    { label: "behind", value: (g) => num(g.behind), num: true },
    { label: "behind (ready)", value: (g) => num(g.behind_ready), num: true },
    { label: "progress", value: (g) => {
      const done = g.committed + g.behind ? g.committed / (g.committed + g.behind) : 0;
      return el("span", { class: "progress", title: pct(g.committed, g.committed + g.behind) },
        el("i", { style: `width:${(100 * done).toFixed(1)}%` }));
    } },
    { label: "consumers", value: (g) => num(g.consumers), num: true },
    { label: "seeks", value: (g) => num(g.seeks), num: true },
    { label: "last commit", value: (g) => age(g.last_commit_ms) },
  ]));
}

function render() {
  const s = state.summary;
  if (!s) return;
  renderHeadline(s.totals, s.collection);
  renderCollection(s.collection);
  renderRepresentation(s.representation);
  renderCuration(s.curation);
  renderOptimization(s.optimization);
  renderConsumption(s.consumption);
}

// ---------- polling ----------

// With CLAWR1_API_KEYS set, data needs a key allowed to read the pool (and to curate, for writes):
// asked once, kept for the tab.
const KEY_STORE = "clawr1.apiKey";

function authHeaders(extra) {
  const headers = { Accept: "application/json", ...extra };
  const key = sessionStorage.getItem(KEY_STORE);
  if (key) headers.Authorization = `Bearer ${key}`;
  return headers;
}

async function request(url, init) {
  const response = await fetch(url, { ...init, headers: authHeaders(init.headers) });
  if ((response.status === 401 || response.status === 403) && !request.asking && !request.declined) {
    request.asking = true;
    const given = window.prompt(`This Claw-R1 API needs a key for ${url.split("?")[0]} (kind read, or curate):`);
    request.asking = false;
    if (given) {
      sessionStorage.setItem(KEY_STORE, given.trim());
      return request(url, init);
    }
    request.declined = true; // no re-asking on every refresh; reload the page to try again
  }
  if (!response.ok) {
    let reason = response.statusText;
    try { reason = JSON.stringify(await response.json()); } catch (_) { /* keep the status text */ }
    throw new Error(`${response.status} from ${url}: ${reason}`);
  }
  return response;
}

async function getJson(url) {
  return (await request(url, { method: "GET" })).json();
}

async function sendJson(url, body) {
  const init = { method: "POST", body: JSON.stringify(body), headers: { "Content-Type": "application/json" } };
  return (await request(url, init)).json();
}

function showError(err) {
  const box = document.getElementById("error");
  if (err) {
    box.textContent = `refresh failed: ${err.message || err}`;
    box.hidden = false;
  } else {
    box.hidden = true;
  }
}

async function refresh() {
  if (state.busy) return;
  state.busy = true;
  try {
    state.summary = await getJson(`${API}/summary`);
    render();
    showError(null);
    document.getElementById("updated").textContent = `updated ${clock(state.summary.generated_ms)}`;
  } catch (err) {
    showError(err);
  } finally {
    state.busy = false;
  }
  await loadSteps();
}

// Live updates: /v1/dashboard/live pushes a `pulse` event whenever the pool changes; each pulse
// refreshes the panels (at most one refresh in flight; a pulse during one triggers one more after it).
function setLiveStatus(text) {
  const badge = document.getElementById("live-status");
  badge.textContent = text;
  badge.className = `live-status ${text.split(" ")[0]}`;
}

let pending = false;
async function onPulse() {
  if (state.busy) { pending = true; return; }
  await refresh();
  if (document.getElementById("preview").childElementCount) await loadPreview();
  if (pending) { pending = false; onPulse(); }
}

async function goLive() {
  if (state.live) return;
  const controller = new AbortController();
  state.live = controller;
  while (state.live === controller) {
    try {
      setLiveStatus("connecting");
      const response = await request(`${API}/live`, { method: "GET", signal: controller.signal,
        headers: { Accept: "text/event-stream" } });
      setLiveStatus("live");
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          if (block.startsWith("event: pulse")) onPulse();
        }
      }
    } catch (err) {
      if (controller.signal.aborted) return;
      showError(err);
    }
    if (state.live !== controller) return;
    setLiveStatus("reconnecting");
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
}

function pause() {
  if (state.live) state.live.abort();
  state.live = null;
  setLiveStatus("paused");
}

function init() {
  document.getElementById("refresh").addEventListener("click", () => onPulse());
  document.getElementById("live-mode").addEventListener("change",
    (event) => (event.target.value === "live" ? goLive() : pause()));
  document.getElementById("preview-form").addEventListener("submit", (e) => { e.preventDefault(); loadPreview(); });
  document.getElementById("curate-form").addEventListener("submit", (e) => {
    e.preventDefault();
    curateFromBar({ step_ids: [...state.selected] });
  });
  document.getElementById("curate-filter").addEventListener("click", () => curateFromBar({ filters: state.filters }));
  document.getElementById("tree-close").addEventListener("click", closeTree);
  document.getElementById("data-channel").addEventListener("change",
    (event) => setFilter({ channel: event.target.value || null }));
  document.getElementById("prev").addEventListener("click", () => {
    state.offset = Math.max(0, state.offset - PAGE_SIZE); loadSteps();
  });
  document.getElementById("next").addEventListener("click", () => { state.offset += PAGE_SIZE; loadSteps(); });
  document.getElementById("detail-close").addEventListener("click", closeStep);
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") { closeStep(); closeTree(); } });
  for (const button of document.querySelectorAll("#timeline-mode button")) {
    button.addEventListener("click", () => {
      state.timelineMode = button.dataset.mode;
      for (const b of document.querySelectorAll("#timeline-mode button")) b.classList.toggle("on", b === button);
      if (state.summary) renderCollection(state.summary.collection);
    });
  }
  const linked = new URLSearchParams(location.hash.slice(1)).get("step");
  if (linked) openStep(linked);
  refresh().then(goLive);
}

init();
