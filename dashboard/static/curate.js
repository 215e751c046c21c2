// Curation as feedback: POST /v1/dashboard/curate with step ids or a whole filter, and the small form
// the inspector and the trajectory view put beside what they show.

import { sendJson } from "./api.js";
import { el } from "./dom.js";

export async function curate(body) {
  try {
    const reply = await sendJson("curate", body);
    return `curated ${reply.steps} step(s): ${reply.accepted} feedback record(s) sent`;
  } catch (err) {
    return `curation failed: ${err.message || err}`;
  }
}

// Exclude, label and note for `target` ({step_ids} or {filters}); `prefix` names its inputs by id
// ("step" gives #step-exclude, #step-curate...) where a page holds one such form, null leaves them unnamed.
export function curateForm(target, prefix, what = "from training") {
  const id = (name) => (prefix ? `${prefix}-${name}` : null);
  const exclude = el("input", { type: "checkbox", id: id("exclude"), class: "curate-exclude" });
  const label = el("input", { id: id("label"), size: 12, placeholder: "label", class: "curate-label" });
  const note = el("input", { id: id("note"), size: 20, placeholder: "note", class: "curate-note" });
  const result = el("span", { class: "muted curate-result", id: id("curate-result") });
  const apply = el("button", { type: "button", id: id("curate"), class: "curate-apply" }, "apply");
  apply.addEventListener("click", async () => {
    const body = { ...target };
    if (exclude.checked) body.exclude = true;
    if (label.value.trim()) body.labels = [label.value.trim()];
    if (note.value.trim()) body.note = note.value.trim();
    result.textContent = await curate(body);
  });
  return el("div", { class: "inline-form curate-step" },
    el("label", {}, exclude, ` exclude ${what}`), label, note, apply, result);
}
