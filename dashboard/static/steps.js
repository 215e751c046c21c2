// The latest-steps table: filters (set by clicks anywhere on the page), paging, row selection and the
// curation bar that applies to the selected rows or to the whole filter.

import { getJson } from "./api.js";
import { curate } from "./curate.js";
import { el, link, mount, statusTag, table, tag } from "./dom.js";
import { channelOf, num, shortTime, version } from "./format.js";
import { emit, state } from "./state.js";

const PAGE_SIZE = 20;

export function setFilter(changes) {
  state.filters = { ...state.filters, ...changes };
  for (const [k, v] of Object.entries(state.filters)) if (v === null || v === undefined) delete state.filters[k];
  state.offset = 0;
  loadSteps();
  document.getElementById("latest").scrollIntoView({ behavior: "smooth" });
}

function renderFilters() {
  document.getElementById("data-channel").value = state.filters.channel || "";
  const entries = Object.entries(state.filters);
  mount("filters", entries.length
    ? entries.map(([k, v]) => el("button", { type: "button", title: "remove filter",
      onclick: () => { delete state.filters[k]; state.offset = 0; loadSteps(); } }, `${k} = ${v} ×`))
    : el("span", { class: "muted" }, "no filters: click a source, group, provenance or policy version to filter"));
}

function pickBox(step) {
  const box = el("input", { type: "checkbox", class: "pick", "data-step": step.step_id, title: "select for curation" });
  box.checked = state.selected.has(step.step_id);
  box.addEventListener("click", (e) => {
    e.stopPropagation();
    if (box.checked) state.selected.add(step.step_id); else state.selected.delete(step.step_id);
    document.getElementById("selected-count").textContent = `${state.selected.size} selected`;
  });
  return box;
}

const COLUMNS = [
  { label: "", value: pickBox },
  { label: "created", value: (s) => shortTime(s.created_ms) },
  { label: "step", value: (s) => s.step_id, wide: true },
  { label: "trajectory", wide: true, title: "click: the trajectory as a conversation",
    value: (s) => link(s.trajectory_id, () => emit("open-trajectory", s.trajectory_id), { class: "link traj-link" }) },
  { label: "#", value: (s) => s.step_index, num: true },
  { label: "source", value: (s) => `${channelOf(s.source_kind)}/${s.source_name}`, wide: true },
  { label: "policy", value: (s) => version(s.policy_version) },
  { label: "status", value: statusTag },
  { label: "tokens p/r", value: (s) => `${s.prompt_tokens}/${s.response_tokens}`, num: true },
  { label: "provenance", value: (s) => s.token_provenance },
  { label: "reward", num: true, title: "the reward, tagged while it is not final",
    value: (s) => el("span", {}, s.reward_status === "final" ? "" : tag(s.reward_status, "warn"), num(s.reward)) },
  { label: "ready", value: (s) => (s.ready ? tag("ready", "good") : tag("not ready")) },
  { label: "labels", value: (s) => s.quality_labels.join(", "), wide: true },
  { label: "v", value: (s) => s.version, num: true, title: "the step's version (it grows as rewards and labels land)" },
];

export async function loadSteps() {
  const params = new URLSearchParams({ limit: PAGE_SIZE, offset: state.offset, ...state.filters });
  try {
    const page = await getJson(`steps?${params}`);
    state.total = page.total;
    renderFilters();
    mount("steps", table(page.steps, COLUMNS, (s) => emit("open-step", s.step_id)));
    const last = Math.min(state.offset + PAGE_SIZE, state.total);
    document.getElementById("page").textContent =
      state.total ? `${state.offset + 1}–${last} of ${num(state.total)}` : "0 steps";
    document.getElementById("prev").disabled = state.offset === 0;
    document.getElementById("next").disabled = last >= state.total;
  } catch (err) {
    emit("error", err);
  }
}

function curationFromForm() {
  const body = {};
  const labels = document.getElementById("curate-labels").value.split(",").map((l) => l.trim()).filter(Boolean);
  if (labels.length) body.labels = labels;
  const quality = document.getElementById("curate-quality").value;
  if (quality) body.quality = quality;
  if (document.getElementById("curate-untrainable").checked) body.trainable = false;
  if (document.getElementById("curate-exclude").checked) body.exclude = true;
  const note = document.getElementById("curate-note").value.trim();
  if (note) body.note = note;
  return body;
}

async function curateFromBar(target) {
  const out = document.getElementById("curate-result");
  out.textContent = await curate({ ...curationFromForm(), ...target });
  state.selected.clear();
  document.getElementById("selected-count").textContent = "0 selected";
}

// The table's own controls: channel selector, pager, curation bar.
export function wireSteps() {
  document.getElementById("data-channel").addEventListener("change",
    (event) => setFilter({ channel: event.target.value || null }));
  document.getElementById("prev").addEventListener("click", () => {
    state.offset = Math.max(0, state.offset - PAGE_SIZE); loadSteps();
  });
  document.getElementById("next").addEventListener("click", () => { state.offset += PAGE_SIZE; loadSteps(); });
  document.getElementById("curate-form").addEventListener("submit", (e) => {
    e.preventDefault();
    curateFromBar({ step_ids: [...state.selected] });
  });
  document.getElementById("curate-filter").addEventListener("click", () => curateFromBar({ filters: state.filters }));
}
