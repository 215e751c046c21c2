// One step's detail (the inspector): identity, provenance, tokens, reward, curation, the prompt as sent,
// the response, feedback, merge scopes. Opened by clicking a step anywhere; its URL is #step=<id>.

import { getJson, segment } from "./api.js";
import { curateForm } from "./curate.js";
import { el, kv, link, linkTag, mount, pre, statusTag, table, tag } from "./dom.js";
import { channelOf, num, time, version } from "./format.js";
import { messages, toolCalls } from "./messages.js";
import { emit } from "./state.js";

export async function openStep(stepId) {
  history.replaceState(null, "", `#step=${encodeURIComponent(stepId)}`);
  document.getElementById("detail").hidden = false;
  document.getElementById("detail-title").textContent = stepId;
  try {
    renderStep(await getJson(`steps/${segment(stepId)}`));
  } catch (err) {
    mount("detail-body", el("div", { class: "error" }, String(err.message || err)));
  }
}

export function closeStep() {
  document.getElementById("detail").hidden = true;
}

// Response tokens as a strip, each cell coloured by its logprob (darker = less likely).
function heatStrip(ids, logprobs) {
  if (!ids || !ids.length) return [];
  const cells = ids.map((id, k) => {
    const lp = logprobs && k < logprobs.length ? logprobs[k] : null;
    const p = lp === null ? null : Math.exp(lp);
    const style = p === null ? "background:#ddd" : `background:hsl(${Math.round(120 * p)},65%,${40 + 20 * p}%)`;
    return el("i", { style, title: `#${id} logprob ${lp === null ? "—" : lp.toFixed(3)}` });
  });
  return [el("div", { class: "muted" }, "response tokens by probability (hover for id and logprob)"),
    el("div", { class: "heat", id: "heat" }, cells)];
}

export const FEEDBACK_COLUMNS = [
  { label: "received", value: (f) => time(f.received_ms) },
  { label: "on", value: (f) => f.target_kind },
  { label: "source", value: (f) => `${f.source}/${f.source_name}` },
  { label: "reward", value: (f) => num(f.reward), num: true },
  { label: "final", value: (f) => (f.final ? "yes" : "no") },
  { label: "label", value: (f) => f.label },
  { label: "comment", value: (f) => f.comment, wide: true },
  { label: "correction", value: (f) => f.correction, wide: true },
];

function renderStep(detail) {
  const s = detail.step;
  const logprobMean = s.logprob_count ? s.logprob_sum / s.logprob_count : null;
  mount("detail-body",
    el("h4", {}, "identity"),
    kv([
      ["trajectory", el("span", {}, link(s.trajectory_id, () => emit("open-trajectory", s.trajectory_id),
        { id: "detail-trajectory", title: "the trajectory as a conversation" }), " ",
      link("filter the table", () => emit("filter", { trajectory_id: s.trajectory_id }), { class: "link muted" }))],
      ["step index", s.step_index], ["parent step", s.parent_step_id],
      ["prompt group", s.prompt_group_id ? link(`${s.prompt_group_id} (size ${s.prompt_group_size ?? "?"})`,
        () => emit("open-group", s.prompt_group_id)) : null],
      ["prompt id", s.prompt_id], ["response id", s.response_id], ["version", s.version],
      ["link status", linkTag(s.link_status)],
      ["link candidate", s.link_candidate_step_id
        ? link(s.link_candidate_step_id, () => openStep(s.link_candidate_step_id)) : null],
      ["data channel", s.channel],
    ]),
    el("h4", {}, "curate this step"),
    curateForm({ step_ids: [s.step_id] }, "step"),
    el("h4", {}, "provenance"),
    kv([
      ["source", `${s.source_kind} · ${s.source_name} (${channelOf(s.source_kind)})`],
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
    toolCalls(s.tool_calls),
    el("h4", {}, "feedback"),
    table(detail.feedback_records, FEEDBACK_COLUMNS),
    Array.isArray(s.feedback) && s.feedback.length ? pre(s.feedback) : [],
    el("h4", {}, "prefix-merge scopes"),
    table(detail.prefix_scopes, [
      { label: "kind", value: (p) => p.scope_kind },
      { label: "scope", value: (p) => p.scope_id, wide: true },
      { label: "total", value: (p) => num(p.total_tokens), num: true },
      { label: "tree", value: (p) => num(p.tree_tokens), num: true },
      { label: "ratio", value: (p) => `${num(p.savings_ratio, 2)}×`, num: true },
      { label: "forks", value: (p) => p.forks, num: true },
    ], (p) => emit("open-tree", p.scope_kind, p.scope_id)),
    el("h4", {}, "trajectory"),
    table(detail.trajectory_steps, [
      { label: "#", value: (t) => t.step_index, num: true },
      { label: "step", value: (t) => (t.step_id === s.step_id ? `▶ ${t.step_id}` : t.step_id), wide: true },
      { label: "status", value: statusTag },
      { label: "reward", value: (t) => num(t.reward), num: true },
      { label: "reward status", value: (t) => t.reward_status },
      { label: "ready", value: (t) => (t.ready ? "yes" : "no") },
    ], (t) => openStep(t.step_id)),
    el("h4", {}, "metadata"),
    pre(s.metadata));
}
