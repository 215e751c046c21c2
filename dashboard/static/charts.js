// Charts as inline SVG, sized by their viewBox so they scale with their card; no chart grows with
// the amount of data it shows (more items make thinner bars or columns, never a taller chart).

import { el, empty, svg } from "./dom.js";
import { num, PALETTE, pct } from "./format.js";

// Horizontal bars: items [{label, value, color, title, text, onClick}].
export function bars(items, opts = {}) {
  if (!items.length) return empty();
  const width = 300, row = 20, labelW = opts.labelWidth || 110;
  const max = Math.max(1, ...items.map((i) => i.value));
  const chart = svg("svg", { viewBox: `0 0 ${width} ${items.length * row}`, width: "100%", role: "img" });
  items.forEach((item, i) => {
    const y = i * row;
    const w = ((width - labelW - 60) * item.value) / max;
    chart.append(svg("g", { class: item.onClick ? "clickable" : null, onclick: item.onClick || null },
      svg("title", {}, item.title || `${item.label}: ${num(item.value)}`),
      svg("text", { x: 0, y: y + 14 }, item.label.length > 18 ? `${item.label.slice(0, 17)}…` : item.label),
      svg("rect", { x: labelW, y: y + 4, width: Math.max(w, item.value ? 1 : 0), height: row - 8,
        fill: item.color || PALETTE[0], rx: 2 }),
      svg("text", { x: labelW + w + 4, y: y + 14 }, item.text || num(item.value))));
  });
  return chart;
}

// Stacked columns: labels [x labels], series [{name, color, values}]; opts.width and opts.height set
// the aspect (a wide card takes a wide chart), opts.marks a red dot per column (failures).
export function columns(labels, series, opts = {}) {
  if (!labels.length) return empty();
  const width = opts.width || 600, height = opts.height || 150, left = 34, bottom = 18, top = 6;
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
  const every = Math.max(1, Math.ceil(labels.length / (opts.ticks || 6)));
  labels.forEach((label, i) => {
    if (i % every === 0) {
      chart.append(svg("text", { x: left + i * slot + slot / 2, y: height - 4, "text-anchor": "middle" }, label));
    }
  });
  return chart;
}

// One 100% stacked bar and its legend: parts [{label, value, color, onClick}].
export function stackBar(parts) {
  const total = parts.reduce((s, p) => s + p.value, 0);
  const chart = svg("svg", { viewBox: "0 0 300 18", width: "100%", height: 18, preserveAspectRatio: "none",
    role: "img" });
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
  const key = el("div", { class: "legend" }, parts.map((p) =>
    el("span", { class: p.onClick ? "click" : "", onclick: p.onClick || null },
      el("i", { style: `background:${p.color}` }), `${p.label} ${num(p.value)} (${pct(p.value, total)})`)));
  return [chart, key];
}

export function legend(series) {
  return el("div", { class: "legend" },
    series.map((s) => el("span", {}, el("i", { style: `background:${s.color}` }), s.name)));
}

// A heat map of shares: columns [{label, cells: [share 0..1 per row, bottom row first], title: j => text,
// line: 0..1 or null}], axis [bottom label, top label]. The line (e.g. the mean) is drawn over the
// columns; opts.picked outlines a column, opts.onPick(i) makes columns clickable.
export function heatmap(cols, axis, opts = {}) {
  if (!cols.length) return empty();
  const width = opts.width || 640, height = opts.height || 160, left = 40, bottom = 16, top = 4, right = 4;
  const rows = cols[0].cells.length;
  const plotW = width - left - right, plotH = height - top - bottom;
  const colW = plotW / cols.length, rowH = plotH / rows;
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, width: "100%", role: "img", class: "heatmap" });
  cols.forEach((col, i) => {
    const x = left + i * colW;
    const group = svg("g", { class: opts.onPick ? "clickable" : null, "data-col": i,
      onclick: opts.onPick ? () => opts.onPick(i) : null });
    // The whole column is the click target, the gaps between its cells included.
    group.append(svg("rect", { x, y: top, width: colW, height: plotH, fill: "transparent" }));
    col.cells.forEach((share, j) => {
      group.append(svg("rect", { x: x + 0.3, y: top + plotH - (j + 1) * rowH + 0.3, width: Math.max(0.4, colW - 0.6),
        height: rowH - 0.6, fill: share > 0 ? `hsl(215,75%,${Math.round(90 - 58 * Math.sqrt(share))}%)` : "#f3f4f7" },
      svg("title", {}, col.title(j))));
    });
    chart.append(group);
  });
  const points = cols.map((col, i) => (col.line === null || col.line === undefined ? null
    : `${(left + (i + 0.5) * colW).toFixed(1)},${(top + plotH * (1 - col.line)).toFixed(1)}`)).filter(Boolean);
  if (points.length) {
    chart.append(svg("polyline", { points: points.join(" "), fill: "none", stroke: "#d98a1c", "stroke-width": 2,
      "pointer-events": "none" }));
  }
  if (opts.picked !== undefined && opts.picked !== null && opts.picked >= 0) {
    chart.append(svg("rect", { x: left + opts.picked * colW, y: top, width: colW, height: plotH, fill: "none",
      stroke: "#1d2330", "stroke-width": 1.5, "pointer-events": "none", class: "picked" }));
  }
  chart.append(svg("text", { x: left - 4, y: top + plotH, "text-anchor": "end" }, axis[0]),
    svg("text", { x: left - 4, y: top + 8, "text-anchor": "end" }, axis[1]));
  const every = Math.max(1, Math.ceil(cols.length / (opts.ticks || 12)));
  cols.forEach((col, i) => {
    if (i % every === 0) {
      chart.append(svg("text", { x: left + (i + 0.5) * colW, y: height - 3, "text-anchor": "middle" }, col.label));
    }
  });
  return chart;
}

// Lines over time: points [{t, values: {name: value}}], names the series; the newest point right.
export function lines(points, names, opts = {}) {
  const w = opts.width || 300, h = opts.height || 90, n = points.length;
  const max = Math.max(1, ...points.flatMap((p) => Object.values(p.values)));
  const x = (i) => (n === 1 ? w : (i * w) / (n - 1));
  const paths = names.map((name, k) => svg("polyline", { fill: "none", stroke: PALETTE[k % PALETTE.length],
    "stroke-width": 2, points: points.map((p, i) => `${x(i).toFixed(1)},${(h - ((p.values[name] || 0) * h) / max)
      .toFixed(1)}`).join(" ") }));
  return svg("svg", { width: "100%", height: h + 14, viewBox: `0 0 ${w} ${h + 14}`, preserveAspectRatio: "none" },
    paths, svg("text", { x: 2, y: h + 12 }, `${opts.caption || "max"} ${num(max)}`));
}
