// A trajectory as the conversation it was (GET trajectories/{id}): per step, the prompt messages it
// added, the model's reply and tool calls, rewards and feedback, link status, provenance, policy
// version, and its token ids beside their text (decoded with the step's tokenizer when the pool knows
// it, otherwise the captured text). Also a prompt group's rollouts side by side (GET prompt-groups/{id}).
// Its URL is #trajectory=<id> (or #group=<id>).

import { getJson, segment } from "./api.js";
import { curateForm } from "./curate.js";
import { el, kv, link, linkTag, mount, stats, statusTag, table, tag } from "./dom.js";
import { channelOf, num, time, version } from "./format.js";
import { contentText, message, messages, toolCalls } from "./messages.js";
import { FEEDBACK_COLUMNS } from "./inspector.js";
import { emit } from "./state.js";

function show(title, hash) {
  history.replaceState(null, "", hash);
  document.getElementById("conversation").hidden = false;
  document.getElementById("conversation-title").textContent = title;
}

export async function openTrajectory(trajectoryId) {
  const id = String(trajectoryId).trim();
  if (!id) return;
  show(`trajectory ${id}`, `#trajectory=${encodeURIComponent(id)}`);
  mount("conversation-body", el("div", { class: "muted" }, "loading…"));
  try {
    renderTrajectory(await getJson(`trajectories/${segment(id)}`));
  } catch (err) {
    mount("conversation-body", el("div", { class: "error" }, String(err.message || err)));
  }
}

export async function openGroup(groupId) {
  show(`prompt group ${groupId}`, `#group=${encodeURIComponent(groupId)}`);
  mount("conversation-body", el("div", { class: "muted" }, "loading…"));
  try {
    renderGroup(await getJson(`prompt-groups/${segment(groupId)}`));
  } catch (err) {
    mount("conversation-body", el("div", { class: "error" }, String(err.message || err)));
  }
}

export function closeConversation() {
  document.getElementById("conversation").hidden = true;
}

function rewardTag(value, status) {
  if (value === null || value === undefined) return tag(`reward ${status || "pending"}`, "warn");
  return tag(`reward ${num(value)}${status === "final" ? "" : ` (${status})`}`,
    value > 0 ? "good" : value < 0 ? "bad" : "");
}

// Token ids and, beside them, their text: one chip per id when the tokenizer is known, else the
// captured text of what those ids encode (the new prompt messages, or the reply).
function tokens(title, view, captured, decodedWith, tokenizer) {
  if (!view.total) return el("div", { class: "tokens muted" }, `${title}: no token ids`);
  const shown = view.ids.length;
  const range = view.start ? `ids ${num(view.start)}–${num(view.start + shown - 1)} of ${num(view.total)}`
    : `${num(view.total)} ids${shown < view.total ? `, first ${num(shown)}` : ""}`;
  const text = view.pieces
    ? el("div", { class: "pieces", title: `decoded with ${decodedWith}` },
      view.pieces.map((piece, k) => el("span", { class: "piece", title: `#${view.ids[k]}` }, piece)))
    : el("pre", { class: "captured" }, captured);
  return el("details", { class: "tokens" },
    el("summary", {}, `${title} tokens: ${range}`, el("span", { class: "muted" }, view.pieces
      ? ` · decoded with ${decodedWith}`
      : tokenizer ? ` · made by ${tokenizer}, not the dashboard's tokenizer (CLAWR1_TOKENIZER): captured text beside`
        : " · no tokenizer recorded for these ids: captured text beside")),
    el("div", { class: "token-pair" }, el("pre", { class: "ids" }, view.ids.join(" ")), text));
}

function turn(step, decodedWith) {
  const p = step.prompt;
  const shownMessages = Array.isArray(p.messages) ? p.messages : null;
  const promptNote = step.step_index === 0 && !p.repeated ? "prompt"
    : `new in the prompt${p.repeated ? ` (after ${p.repeated} earlier message${p.repeated === 1 ? "" : "s"})` : ""}`;
  const capturedPrompt = shownMessages ? shownMessages.map((m) => `${m.role}: ${contentText(m.content)}`).join("\n")
    : contentText(p.messages);
  const reply = [step.response_text ? el("pre", { class: "text" }, step.response_text) : null,
    ...toolCalls(step.tool_calls)].filter(Boolean);
  const capturedReply = [step.response_text, ...(step.tool_calls || []).map((c) => (c.function
    ? `${c.function.name}(${c.function.arguments})` : JSON.stringify(c)))].filter(Boolean).join("\n");
  return el("section", { class: `turn ${step.status === "failed" ? "failed" : ""}`, "data-step": step.step_id },
    el("div", { class: "turn-head" },
      el("b", {}, `step ${step.step_index}`),
      link(step.step_id, () => emit("open-step", step.step_id), { class: "link muted", title: "the step's detail" }),
      tag(version(step.policy_version)), statusTag(step), linkTag(step.link_status),
      rewardTag(step.reward, step.reward_status),
      step.ready ? tag("ready", "good") : tag("not ready"),
      step.quality_labels.map((l) => tag(l, l === "excluded" || l === "untrainable" ? "bad" : "")),
      el("span", { class: "muted" }, `${step.token_provenance} ids · ${step.model || "?"} · ${time(step.created_ms)}`)),
    p.rewritten ? el("div", { class: "warn-note" }, "this prompt does not extend the previous step's: the agent rewrote its history") : null,
    el("div", { class: "muted sub" }, promptNote),
    shownMessages ? (shownMessages.length ? shownMessages.map(message) : el("div", { class: "empty" }, "nothing new"))
      : messages(p.messages),
    el("div", { class: "muted sub" }, "response"),
    el("div", { class: "message role-assistant reply" }, el("div", { class: "role" }, "assistant (this step's reply)"),
      reply.length ? reply : el("div", { class: "empty" }, step.error ? `failed: ${step.error}` : "(empty)")),
    tokens("prompt", step.prompt_ids, capturedPrompt, decodedWith, step.tokenizer),
    tokens("response", step.response_ids, capturedReply, decodedWith, step.tokenizer),
    el("div", { class: "turn-foot" },
      step.feedback_records.length ? table(step.feedback_records, FEEDBACK_COLUMNS) : null,
      Object.keys(step.reward_components || {}).length
        ? el("div", { class: "muted" }, `reward components ${JSON.stringify(step.reward_components)}`) : null,
      step.link_candidate_step_id ? el("div", { class: "muted" }, "link candidate ",
        link(step.link_candidate_step_id, () => emit("open-step", step.link_candidate_step_id))) : null,
      curateForm({ step_ids: [step.step_id] }, null, "this step")));
}

function renderTrajectory(t) {
  const h = t.trajectory;
  mount("conversation-body",
    stats([["steps", num(h.steps)], ["reward sum", num(h.reward_sum)],
      ["trajectory reward", num(h.trajectory_reward)], ["failed", num(h.failed)],
      ["policy", h.policy_versions.map(version).join(", ") || "none"],
      ["ready", h.all_ready ? "all" : "not all"]]),
    kv([
      ["source", `${h.source_kind} · ${h.source_name} (${channelOf(h.source_kind)}) · ${h.agent || "no agent name"}`],
      ["prompt group", h.prompt_group_id ? link(h.prompt_group_id, () => emit("open-group", h.prompt_group_id)) : null],
      ["time", `${time(h.started_ms)} → ${time(h.last_ms)}${h.terminal ? " · terminal" : ""}`],
      ["steps table", link("filter the latest steps to this trajectory", () => {
        closeConversation(); emit("filter", { trajectory_id: h.trajectory_id });
      })],
    ]),
    el("h4", {}, "curate the whole trajectory"),
    curateForm({ filters: { trajectory_id: h.trajectory_id } }, "trajectory", "every step"),
    t.feedback_records.length ? [el("h4", {}, "feedback on the trajectory"), table(t.feedback_records, FEEDBACK_COLUMNS)]
      : [],
    el("h4", {}, "conversation"),
    el("div", { class: "turns" }, t.steps.map((step) => turn(step, t.decoder))),
    t.more_steps ? el("div", { class: "muted" }, `only the first ${t.steps.length} steps are shown`) : null);
}

function renderGroup(g) {
  mount("conversation-body",
    el("div", { class: "inline-form" }, link("filter the latest steps to this group", () => {
      closeConversation(); emit("filter", { prompt_group_id: g.prompt_group_id });
    })),
    el("h4", {}, "curate the whole group"),
    curateForm({ filters: { prompt_group_id: g.prompt_group_id } }, null, "every step"),
    el("h4", {}, "the prompt they share"),
    messages(g.prompt_messages),
    el("h4", {}, `rollouts (${g.trajectories.length})`),
    table(g.trajectories, [
      { label: "trajectory", value: (r) => r.trajectory_id, wide: true },
      { label: "steps", value: (r) => num(r.num_steps), num: true },
      { label: "reward sum", value: (r) => num(r.reward_sum), num: true },
      { label: "traj. reward", value: (r) => num(r.trajectory_reward), num: true },
      { label: "policy", value: (r) => version(r.policy_version) },
      { label: "ready", value: (r) => (r.all_ready ? tag("ready", "good") : tag("not ready")) },
      { label: "final reply", value: (r) => r.last_response, wide: true },
    ], (r) => openTrajectory(r.trajectory_id)),
    el("div", { class: "muted" }, "click a rollout for its conversation"));
}
