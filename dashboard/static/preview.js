// What the trainer will get (GET preview): a consumer group's next poll through the SDK, not committed.

import { getJson } from "./api.js";
import { el, mount, stats, table } from "./dom.js";
import { num, version } from "./format.js";
import { emit } from "./state.js";

const value = (id) => document.getElementById(id).value.trim();

export function previewShown() {
  return document.getElementById("preview").childElementCount > 0;
}

export async function loadPreview() {
  const params = new URLSearchParams({
    group: value("preview-group") || "preview",
    whole_groups: document.getElementById("preview-whole").checked,
  });
  if (value("preview-preset")) params.set("preset", value("preview-preset"));
  if (value("preview-groups") && params.get("whole_groups") === "true") params.set("max_groups", value("preview-groups"));
  if (value("preview-version")) params.set("policy_version", value("preview-version"));
  try {
    const b = await getJson(`preview?${params}`);
    mount("preview", stats([["steps", num(b.steps)], ["groups", num(b.groups)],
      ["prompt tokens", num(b.prompt_tokens)], ["response tokens", num(b.response_tokens)],
      ["packed tokens", num(b.packed.tree_tokens)], ["packing saves", `${num(b.packed.savings_ratio, 2)}×`]]),
    el("div", { class: "scroll-y" }, table(b.rows, [
      { label: "step", value: (r) => el("span", { class: "preview-step" }, r.step_id), wide: true },
      { label: "group", value: (r) => r.prompt_group_id, wide: true },
      { label: "#", value: (r) => r.step_index, num: true },
      { label: "policy", value: (r) => version(r.policy_version) },
      { label: "reward", value: (r) => num(r.reward), num: true },
      { label: "tokens p/r", value: (r) => `${r.prompt_tokens}/${r.response_tokens}`, num: true },
      { label: "labels", value: (r) => r.quality_labels.join(", ") },
    ], (r) => emit("open-step", r.step_id))));
  } catch (err) {
    mount("preview", el("div", { class: "error" }, String(err.message || err)));
  }
}
