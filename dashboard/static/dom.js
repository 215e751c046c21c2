// Small DOM builders. Text from the pool only ever becomes a text node or an attribute value, never
// markup, so captured prompts cannot inject anything into the page.

import { num } from "./format.js";
import { state } from "./state.js";

const SVG_NS = "http://www.w3.org/2000/svg";

function build(node, attrs, children) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "onclick") node.addEventListener("click", value);
    else if (key === "class" && !(node instanceof SVGElement)) node.className = value;
    else node.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function el(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

export function svg(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

export function mount(id, ...children) {
  document.getElementById(id).replaceChildren(...children.flat());
}

export const empty = (text) => el("div", { class: "empty" }, text || "nothing yet");

export function tag(text, kind) {
  return el("span", { class: `tag ${kind || ""}` }, text);
}

export function statusTag(step) {
  return step.status === "failed" ? tag("failed", "bad") : step.status === "ok" ? tag("ok", "good")
    : tag(step.status, "warn");
}

export function linkTag(status) {
  return tag(status, status === "superseded" ? "bad" : status === "ambiguous" ? "warn" : "good");
}

export function link(text, onclick, attrs = {}) {
  return el("a", { class: "link", ...attrs, onclick: (e) => { e.stopPropagation(); onclick(e); } }, text);
}

export function stats(items) {
  return el("div", { class: "stats" },
    items.map(([label, value]) => el("div", { class: "stat" }, el("b", {}, value), el("span", {}, label))));
}

export function kv(pairs) {
  return el("dl", { class: "kv" }, pairs.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v ?? "—")]));
}

export function pre(value) {
  return el("pre", {}, typeof value === "string" ? value : JSON.stringify(value, null, 2));
}

// columns: [{label, value: row => text|Node, num: bool, wide: bool}]; onRow: row => void makes rows
// clickable. opts.page (rows per page) and opts.name (which page to remember in state.pages) page it.
export function table(rows, columns, onRow, opts = {}) {
  if (!rows || rows.length === 0) return empty(opts.empty);
  const size = opts.page || rows.length;
  const pages = Math.ceil(rows.length / size);
  const current = Math.min(state.pages[opts.name] || 0, pages - 1);
  const shown = rows.slice(current * size, (current + 1) * size);
  const head = el("tr", {}, columns.map((c) => el("th", { class: cellClass(c), title: c.title || null }, c.label)));
  const body = shown.map((row) => {
    const cells = columns.map((c) => {
      const value = c.value(row);
      const text = value instanceof Node ? "" : String(value ?? "—");
      return el("td", { class: cellClass(c), title: text || null }, value instanceof Node ? value : text);
    });
    const rowClass = [onRow ? "click" : "", opts.rowClass ? opts.rowClass(row) : ""].join(" ").trim();
    return el("tr", { class: rowClass || null, onclick: onRow ? () => onRow(row) : null }, cells);
  });
  const wrap = el("div", { class: "table-wrap" }, el("table", {}, el("thead", {}, head), el("tbody", {}, body)));
  if (pages <= 1) return wrap;
  return [wrap, pager(current, pages, rows.length, size, (page) => {
    state.pages[opts.name] = page;
    opts.redraw();
  })];
}

function cellClass(column) {
  return [column.num ? "num" : "", column.wide ? "wide-cell" : ""].join(" ").trim() || null;
}

function pager(current, pages, total, size, go) {
  const first = current * size + 1;
  const last = Math.min(total, (current + 1) * size);
  return el("div", { class: "pager small" },
    el("button", { type: "button", disabled: current === 0, onclick: () => go(current - 1) }, "‹"),
    el("span", { class: "muted" }, `${first}–${last} of ${num(total)}`),
    el("button", { type: "button", disabled: current >= pages - 1, onclick: () => go(current + 1) }, "›"));
}
