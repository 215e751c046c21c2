// The lifecycle panels drawn from one /v1/dashboard/summary: collection, representation, curation,
// optimization, consumption, and the header's figures. Long lists are paged so no card grows with the
// pool; clicks ask app.js (through emit) to filter the steps table or open a view.

import { bars, columns, legend, lines, stackBar } from "./charts.js";
import { el, empty, mount, stats, table, tag } from "./dom.js";
import {
  age, bucketLabel, CHANNEL_COLORS, channelKinds, color, num, PALETTE, pct, time, version,
} from "./format.js";
import { renderRewards } from "./rewards.js";
import { emit, state } from "./state.js";

const ROWS = 8; // rows per page of a panel's table

// A panel table paged in place: `name` remembers its page across redraws, `redraw` draws it again.
function paged(name, redraw, rows, cols, onRow, size = ROWS) {
  return table(rows, cols, onRow, { page: size, name, redraw });
}

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

function timelineWidth(ms) {
  return ms >= 86400000 ? "day" : ms >= 3600000 ? `${ms / 3600000} h` : ms >= 60000 ? `${ms / 60000} min`
    : `${ms / 1000} s`;
}

export function renderCollection(c) {
  const redraw = () => renderCollection(state.summary.collection);
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
  mount("timeline", tl.buckets.length
    ? [columns(tl.buckets.map((b) => bucketLabel(b, tl.bucket_ms)), series, { marks: failed, width: 900, height: 170,
      ticks: 10 }), legend(series),
    el("div", { class: "muted" }, `buckets of ${timelineWidth(tl.bucket_ms)}; red dots: failed calls`)]
    : empty());

  mount("sources", paged("sources", redraw, c.sources, [
    { label: "channel", value: (r) => r.channel },
    { label: "source kind", value: (r) => r.source_kind },
    { label: "source name", value: (r) => r.source_name || "(unnamed)" },
    { label: "steps", value: (r) => num(r.steps), num: true },
    { label: "failed", value: (r) => num(r.failed), num: true },
    { label: "mean latency", value: (r) => (r.mean_latency_ms === null ? "—" : `${num(r.mean_latency_ms)} ms`),
      num: true },
    { label: "last step", value: (r) => age(r.last_step_ms) },
  ], (r) => emit("filter", { source_kind: r.source_kind, source_name: r.source_name })));

  mount("engines", c.engines.length ? paged("engines", redraw, c.engines, [
    { label: "engine", value: (r) => r.engine, wide: true },
    { label: "state", value: (r) => r.state || "—" },
    { label: "in flight", value: (r) => (r.in_flight === null ? "—" : num(r.in_flight)), num: true },
    { label: "calls/s (1 min)", value: (r) => num(r.calls_per_s), num: true },
    { label: "steps", value: (r) => num(r.steps), num: true },
    { label: "failed", value: (r) => num(r.failed), num: true },
    { label: "policy version", value: (r) => version(r.policy_version) },
    { label: "last step", value: (r) => age(r.last_step_ms) },
  ], (r) => emit("filter", { engine: r.engine })) : el("div", { class: "muted" },
    "no engine recorded yet: captured calls name the engine that served them"));

  mount("failures", paged("failures", redraw, c.recent_failures, [
    { label: "when", value: (r) => time(r.created_ms) },
    { label: "source", value: (r) => `${r.source_kind}/${r.source_name}` },
    { label: "error", value: (r) => r.error, wide: true },
  ], (r) => emit("open-step", r.step_id), 6));
}

const PROVENANCE_COLORS = { engine: "#2e8b57", retokenized: "#d98a1c", none: "#9aa1ad" };

function renderRepresentation(r) {
  const redraw = () => renderRepresentation(state.summary.representation);
  const t = r.trajectories;
  mount("trajectories", stats([
    ["trajectories", num(t.trajectories)], ["steps", num(t.steps)],
    ["mean steps", t.trajectories ? num(t.mean_steps, 2) : "—"], ["longest", num(t.max_steps)],
    ["terminal", num(t.terminal_trajectories)], ["all steps ready", num(t.ready_trajectories)],
  ]));
  mount("steps-per-trajectory", r.steps_per_trajectory.length
    ? [columns(r.steps_per_trajectory.map((row) => String(row.num_steps)),
      [{ name: "trajectories", color: PALETTE[0], values: r.steps_per_trajectory.map((row) => row.trajectories) }],
      { width: 320, height: 120 }), el("div", { class: "muted" }, "x: steps in a trajectory; y: trajectories")]
    : empty());
  mount("provenance",
    stackBar(r.provenance.map((p, i) => ({ label: p.token_provenance, value: p.steps,
      color: PROVENANCE_COLORS[p.token_provenance] || color(i + 3),
      onClick: () => emit("filter", { token_provenance: p.token_provenance }) }))),
    table(r.provenance, [
      { label: "provenance", value: (p) => p.token_provenance },
      { label: "steps", value: (p) => num(p.steps), num: true },
      { label: "prompt tokens", value: (p) => num(p.prompt_tokens), num: true },
      { label: "response tokens", value: (p) => num(p.response_tokens), num: true },
    ]));
  const g = r.prompt_groups;
  mount("prompt-groups",
    stats([["groups", num(g.groups)], ["complete", num(g.complete)], ["steps without a group", num(g.ungrouped_steps)]]),
    paged("prompt-groups", redraw, g.latest, [
      { label: "group", value: (x) => x.prompt_group_id, wide: true },
      { label: "size", value: (x) => num(x.group_size), num: true },
      { label: "trajectories", value: (x) => num(x.num_trajectories), num: true },
      { label: "steps", value: (x) => num(x.num_steps), num: true },
      { label: "prompts", value: (x) => num(x.distinct_prompts), num: true },
      { label: "mean reward", value: (x) => num(x.mean_reward), num: true },
      { label: "reward std", value: (x) => num(x.reward_std), num: true },
      { label: "final", value: (x) => num(x.final_rewards), num: true, title: "final rewards" },
      { label: "ready", value: (x) => (x.all_ready ? tag("ready", "good") : tag("not ready")) },
      { label: "started", value: (x) => time(x.started_at_ms) },
    ], (x) => emit("open-group", x.prompt_group_id)));
}

function renderCuration(c) {
  const redraw = () => renderCuration(state.summary.curation);
  const t = c.totals;
  mount("readiness",
    el("div", { class: "muted" }, "readiness"),
    stackBar([
      { label: "ready", value: t.ready_steps, color: "#2e8b57", onClick: () => emit("filter", { ready: true }) },
      { label: "not ready", value: t.steps - t.ready_steps, color: "#9aa1ad",
        onClick: () => emit("filter", { ready: false }) },
    ]),
    el("div", { class: "muted" }, "reward status"),
    stackBar([
      { label: "final", value: t.reward_final, color: "#2f6fdd", onClick: () => emit("filter", { reward_status: "final" }) },
      { label: "pending", value: t.reward_pending, color: "#d98a1c",
        onClick: () => emit("filter", { reward_status: "pending" }) },
    ]),
    stats([["with a reward", num(t.rewarded)], ["failed", num(t.failed)], ["quality scored", num(t.scored)],
      ["mean quality score", num(t.mean_quality_score)]]));
  renderRewards(c);
  mount("labels", bars(c.quality_labels.map((l, i) => ({ label: l.label, value: l.steps, color: color(i) }))));
  mount("feedback", paged("feedback", redraw, c.feedback, [
    { label: "source", value: (f) => f.source || "(none)" },
    { label: "on", value: (f) => f.target_kind },
    { label: "items", value: (f) => num(f.items), num: true },
    { label: "rewards", value: (f) => num(f.rewards), num: true },
    { label: "final", value: (f) => num(f.final_items), num: true },
    { label: "labels", value: (f) => num(f.labelled), num: true },
    { label: "corrections", value: (f) => num(f.corrections), num: true },
  ], null, 6));
  const d = c.dead_letters;
  mount("dead-letters", stats([["dead letters", num(d.total)]]), paged("dead-letters", redraw, d.by_reason, [
    { label: "stage", value: (x) => x.stage },
    { label: "reason", value: (x) => x.reason, wide: true },
    { label: "letters", value: (x) => num(x.letters), num: true },
    { label: "last", value: (x) => age(x.last_failed_ms) },
  ], null, 5));
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
    ]));
  mount("scopes", paged("scopes", () => renderOptimization(state.summary.optimization), o.scopes, [
    { label: "kind", value: (s) => s.scope_kind },
    { label: "scope", value: (s) => s.scope_id, wide: true },
    { label: "total", value: (s) => num(s.total_tokens), num: true },
    { label: "tree", value: (s) => num(s.tree_tokens), num: true },
    { label: "saved", value: (s) => num(s.saved_tokens), num: true },
    { label: "ratio", value: (s) => `${num(s.savings_ratio, 2)}×`, num: true },
    { label: "forks", value: (s) => num(s.forks), num: true },
    { label: "nodes", value: (s) => num(s.num_nodes), num: true },
  ], (s) => emit("open-tree", s.scope_kind, s.scope_id)));
}

function renderDrift(rows) {
  const series = [
    { name: "consumed", color: color(1), values: rows.map((r) => r.consumed) },
    { name: "ready, not consumed", color: color(0), values: rows.map((r) => Math.max(0, r.ready_steps - r.consumed)) },
    { name: "not ready", color: "#c5cbd6", values: rows.map((r) => Math.max(0, r.steps - r.ready_steps)) },
  ];
  mount("drift", rows.length
    ? [columns(rows.map((r) => version(r.policy_version)), series, { width: 800, height: 160, ticks: 12 }),
      legend(series)]
    : empty("no policy versions reported yet"));
}

function renderLag(groups) {
  const now = Date.now();
  state.lagHistory.push({ t: now, values: Object.fromEntries(groups.map((g) => [g.group_name, g.behind_ready || 0])) });
  state.lagHistory = state.lagHistory.filter((h) => now - h.t < 10 * 60 * 1000).slice(-120);
  const names = groups.map((g) => g.group_name);
  if (!names.length) { mount("lag", empty("no consumer groups yet")); return; }
  const newest = state.lagHistory[state.lagHistory.length - 1].values;
  mount("lag", lines(state.lagHistory, names, { caption: "max ready steps behind:" }),
    legend(names.map((name, k) => ({ name: `${name}: ${newest[name]}`, color: color(k) }))));
}

function renderConsumption(c) {
  renderDrift(c.policy_drift);
  renderLag(c.groups);
  mount("groups", paged("groups", () => renderConsumption(state.summary.consumption), c.groups, [
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

export function render(s) {
  renderHeadline(s.totals, s.collection);
  renderCollection(s.collection);
  renderRepresentation(s.representation);
  renderCuration(s.curation);
  renderOptimization(s.optimization);
  renderConsumption(s.consumption);
}
