// A merge scope's prefix tree (GET tree): savings, the packed ribbon, the attention-mask thumbnail and
// the stored nodes.

import { getJson } from "./api.js";
import { el, empty, mount, stats, svg } from "./dom.js";
import { num } from "./format.js";

export async function openTree(kind, id) {
  document.getElementById("tree").hidden = false;
  document.getElementById("tree-title").textContent = `${kind} ${id}`;
  try {
    const params = new URLSearchParams({ scope_kind: kind, scope_id: id });
    renderTree(await getJson(`tree?${params}`));
  } catch (err) {
    mount("tree-body", el("div", { class: "error" }, String(err.message || err)));
  }
}

export function closeTree() {
  document.getElementById("tree").hidden = true;
}

function nodeRows(nodes) {
  const children = {};
  const known = new Set(nodes.map((n) => n.node_id));
  for (const n of nodes) (children[known.has(n.parent_node_id) ? n.parent_node_id : ""] ||= []).push(n);
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
  return rows;
}

function renderTree(t) {
  const p = t.packed;
  const rows = nodeRows(t.nodes);
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
