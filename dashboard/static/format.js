// How values read on the page: numbers, shares, times, policy versions, and the colours they wear.

export const PALETTE = ["#2f6fdd", "#2e8b57", "#d98a1c", "#8e44ad", "#c9362b", "#16a0a8", "#7f8c8d", "#b5651d",
  "#5d6dbe", "#9b9b2f"];
export const CHANNEL_COLORS = { proxy: "#2f6fdd", gateway: "#2e8b57", service: "#d98a1c", other: "#7f8c8d" };
const KIND_CHANNEL = { blackbox_agent: "proxy", whitebox_agent: "gateway", blackbox_service: "service" };

export function num(value, digits) {
  if (value === null || value === undefined) return "—";
  if (typeof value !== "number") return String(value);
  if (digits !== undefined) return value.toFixed(digits);
  if (Number.isInteger(value)) return value.toLocaleString("en-US");
  return Math.abs(value) >= 100 ? value.toFixed(1) : String(Number(value.toPrecision(3)));
}

export function pct(part, whole) {
  return whole ? `${((100 * part) / whole).toFixed(1)}%` : "—";
}

export function time(ms) {
  if (!ms) return "—";
  return new Date(ms).toLocaleString("en-GB", { hour12: false });
}

// Today's times as the clock reads; older ones with their day (for narrow table columns).
export function shortTime(ms) {
  if (!ms) return "—";
  const d = new Date(ms);
  if (d.toDateString() === new Date().toDateString()) return clock(ms);
  return `${d.toLocaleDateString("en-GB", { day: "2-digit", month: "2-digit" })} ${clock(ms).slice(0, 5)}`;
}

export function clock(ms) {
  return new Date(ms).toLocaleTimeString("en-GB", { hour12: false });
}

export function bucketLabel(ms, widthMs) {
  return widthMs >= 86400000 ? new Date(ms).toLocaleDateString("en-GB") : clock(ms);
}

export function age(ms) {
  if (!ms) return "—";
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.round(s / 60)}m ago`;
  if (s < 86400) return `${Math.round(s / 3600)}h ago`;
  return `${Math.round(s / 86400)}d ago`;
}

export function version(v) {
  return v === null || v === undefined ? "none" : `v${v}`;
}

export function color(i) {
  return PALETTE[i % PALETTE.length];
}

export function channelOf(sourceKind) {
  return KIND_CHANNEL[sourceKind] || "other";
}

export function channelKinds(channel) {
  return Object.entries(KIND_CHANNEL).filter(([, ch]) => ch === channel).map(([k]) => k).join(", ") || "other";
}
