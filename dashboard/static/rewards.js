// Rewards by policy version in a fixed space however long training runs: a heat map of reward bins x
// version (colour = share of that version's rewarded steps, line = mean reward), the picked version's
// histogram and figures beside it, and the per-version table paged and filtered below.

import { columns, heatmap } from "./charts.js";
import { el, empty, link, mount, stats, table } from "./dom.js";
import { num, version } from "./format.js";
import { emit, state } from "./state.js";

const MAX_COLUMNS = 120; // beyond this many versions, neighbouring versions share a column
const TABLE_ROWS = 6;

// "12" keeps v12, "10-20" keeps v10..v20, "" keeps all; anything else keeps nothing it cannot read.
function versionFilter(text) {
  const t = text.trim();
  if (!t) return () => true;
  const range = t.match(/^v?(\d+)\s*(?:-|–|\.\.)\s*v?(\d+)$/);
  if (range) return (v) => v !== null && v >= Number(range[1]) && v <= Number(range[2]);
  const one = t.match(/^v?(\d+)$/);
  if (one) return (v) => v === Number(one[1]);
  if (t === "none") return (v) => v === null;
  return () => false;
}

// The heat map's columns: versions in order, merged `span` at a time when there are too many.
function mapColumns(rows, histogram) {
  const counts = new Map(histogram.versions.map((v) => [v.policy_version, v.counts]));
  const span = Math.max(1, Math.ceil(rows.length / MAX_COLUMNS));
  const out = [];
  for (let i = 0; i < rows.length; i += span) {
    const group = rows.slice(i, i + span);
    const cells = new Array(histogram.bins).fill(0);
    let rewarded = 0, weighted = 0;
    for (const row of group) {
      (counts.get(row.policy_version) || []).forEach((c, j) => { cells[j] += c; });
      rewarded += row.rewarded;
      weighted += (row.mean_reward ?? 0) * row.rewarded;
    }
    const total = cells.reduce((a, b) => a + b, 0);
    const first = group[0].policy_version, last = group[group.length - 1].policy_version;
    out.push({ rows: group, counts: cells, total, mean: rewarded ? weighted / rewarded : null,
      label: span === 1 ? version(first) : `${version(first)}–${last ?? "none"}` });
  }
  return out;
}

function binLabel(edges, j) {
  return `${num(edges[j])}…${num(edges[j + 1])}`;
}

function pickedPanel(row, histogram) {
  if (!row) return empty("no version picked");
  const counts = (histogram.versions.find((v) => v.policy_version === row.policy_version) || {}).counts;
  return [
    el("div", { class: "picked-head" }, el("b", { id: "rewards-picked-version" }, version(row.policy_version)),
      row.policy_version === null ? null
        : link("filter the steps table", () => emit("filter", { policy_version: row.policy_version }))),
    stats([["steps", num(row.steps)], ["rewarded", num(row.rewarded)], ["final", num(row.final_rewards)],
      ["ready", num(row.ready_steps)], ["mean", num(row.mean_reward)], ["min … max",
        `${num(row.min_reward)} … ${num(row.max_reward)}`]]),
    counts ? columns(histogram.edges.slice(0, -1).map((_, j) => binLabel(histogram.edges, j)),
      [{ name: version(row.policy_version), color: "#2f6fdd", values: counts }], { width: 300, height: 90, ticks: 3 })
      : empty("no rewards in this version yet"),
  ];
}

function renderTable(rows) {
  const keep = versionFilter(state.rewards.filter);
  const newestFirst = rows.filter((r) => keep(r.policy_version)).reverse();
  mount("rewards-table", table(newestFirst, [
    { label: "policy", value: (v) => version(v.policy_version) },
    { label: "steps", value: (v) => num(v.steps), num: true },
    { label: "rewarded", value: (v) => num(v.rewarded), num: true },
    { label: "final", value: (v) => num(v.final_rewards), num: true },
    { label: "ready", value: (v) => num(v.ready_steps), num: true },
    { label: "mean", value: (v) => num(v.mean_reward), num: true },
    { label: "min", value: (v) => num(v.min_reward), num: true },
    { label: "max", value: (v) => num(v.max_reward), num: true },
  ], (v) => { state.rewards.version = v.policy_version; renderRewards(state.summary.curation); },
  { page: TABLE_ROWS, name: "rewards", redraw: () => renderTable(rows), empty: "no version matches the filter",
    rowClass: (v) => (v.policy_version === pickedRow(rows)?.policy_version ? "picked" : "") }));
}

function pickedRow(rows) {
  const wanted = state.rewards.version;
  const found = wanted === undefined ? null : rows.find((r) => r.policy_version === wanted);
  return found || [...rows].reverse().find((r) => r.policy_version !== null) || rows[rows.length - 1] || null;
}

export function renderRewards(curation) {
  const rows = curation.reward_by_version;
  const h = curation.reward_histogram;
  const picked = pickedRow(rows);
  if (!rows.length) {
    mount("rewards-map", empty("no steps yet"));
    mount("rewards-picked");
    mount("rewards-table");
    return;
  }
  document.getElementById("rewards-map").dataset.versions = rows.filter((r) => r.policy_version !== null).length;
  const cols = mapColumns(rows, h);
  const pickedCol = cols.findIndex((c) => c.rows.includes(picked));
  mount("rewards-map", h.edges.length ? [
    heatmap(cols.map((c) => ({
      label: c.label,
      cells: c.counts.map((n) => (c.total ? n / c.total : 0)),
      line: c.mean === null || h.high === h.low ? null : (c.mean - h.low) / (h.high - h.low),
      title: (j) => `${c.label} · reward ${binLabel(h.edges, j)}: ${num(c.counts[j])} of ${num(c.total)} rewarded` +
        ` · mean ${num(c.mean)}`,
    })), [num(h.low), num(h.high)], { picked: pickedCol, width: 640, height: 170,
      onPick: (i) => { state.rewards.version = cols[i].rows[cols[i].rows.length - 1].policy_version;
        renderRewards(curation); } }),
    el("div", { class: "muted" }, `rows: ${h.bins} reward bins from ${num(h.low)} (bottom) to ${num(h.high)}; ` +
      `columns: ${num(rows.length)} policy versions${cols.length < rows.length ? `, ${Math.ceil(rows.length / cols.length)} per column` : ""}; ` +
      "darker = more of that version's rewards; orange line: mean reward. Click a column to pick it."),
  ] : empty("no rewards yet"));
  mount("rewards-picked", pickedPanel(picked, h));
  renderTable(rows);
}

export function wireRewards() {
  document.getElementById("rewards-filter").addEventListener("input", (event) => {
    state.rewards.filter = event.target.value;
    state.pages.rewards = 0;
    if (state.summary) renderTable(state.summary.curation.reward_by_version);
  });
}
