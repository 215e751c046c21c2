// Claw-R1 dashboard, the entry module: wires the page's controls, routes the actions the panels emit
// to the views, and redraws every panel when /v1/dashboard/live pushes a pulse. Native ES modules,
// no build step, nothing loaded from elsewhere (the page's CSP allows only its own scripts).

import { followLive, getJson } from "./api.js";
import { clock } from "./format.js";
import { closeStep, openStep } from "./inspector.js";
import { render, renderCollection } from "./panels.js";
import { loadPreview, previewShown } from "./preview.js";
import { wireRewards } from "./rewards.js";
import { emit, on, state } from "./state.js";
import { loadSteps, setFilter, wireSteps } from "./steps.js";
import { closeConversation, openGroup, openTrajectory } from "./trajectory.js";
import { closeTree, openTree } from "./tree.js";

function showError(err) {
  const box = document.getElementById("error");
  box.hidden = !err;
  if (err) box.textContent = `refresh failed: ${err.message || err}`;
}

async function refresh() {
  if (state.busy) return;
  state.busy = true;
  try {
    state.summary = await getJson("summary");
    render(state.summary);
    showError(null);
    document.getElementById("updated").textContent = `updated ${clock(state.summary.generated_ms)}`;
  } catch (err) {
    showError(err);
  } finally {
    state.busy = false;
  }
  await loadSteps();
}

// At most one refresh in flight; a pulse during one triggers one more after it.
let pending = false;
async function onPulse() {
  if (state.busy) { pending = true; return; }
  await refresh();
  if (previewShown()) await loadPreview();
  if (pending) { pending = false; onPulse(); }
}

function setLiveStatus(text) {
  const badge = document.getElementById("live-status");
  badge.textContent = text;
  badge.className = `live-status ${text}`;
}

function goLive() {
  if (state.live) return;
  const controller = new AbortController();
  state.live = controller;
  followLive(controller.signal, { onPulse, onStatus: setLiveStatus, onError: showError });
}

function pause() {
  if (state.live) state.live.abort();
  state.live = null;
  setLiveStatus("paused");
}

// The side views, topmost first (the inspector opens over a conversation, the tree over both).
const VIEWS = [["tree", closeTree], ["detail", closeStep], ["conversation", closeConversation]];

function close(view) {
  VIEWS.find(([id]) => id === view)[1]();
  if (VIEWS.every(([id]) => document.getElementById(id).hidden)) {
    history.replaceState(null, "", location.pathname + location.search);
  }
}

function closeTopmost() {
  const open = VIEWS.find(([id]) => !document.getElementById(id).hidden);
  if (open) close(open[0]);
}

// The view a shared URL names: #step=<id>, #trajectory=<id> or #group=<id>.
function openLinked() {
  const hash = new URLSearchParams(location.hash.slice(1));
  if (hash.get("trajectory")) openTrajectory(hash.get("trajectory"));
  else if (hash.get("group")) openGroup(hash.get("group"));
  if (hash.get("step")) openStep(hash.get("step"));
}

function init() {
  on("filter", setFilter);
  on("open-step", openStep);
  on("open-trajectory", openTrajectory);
  on("open-group", openGroup);
  on("open-tree", openTree);
  on("error", showError);
  document.getElementById("refresh").addEventListener("click", () => onPulse());
  document.getElementById("live-mode").addEventListener("change",
    (event) => (event.target.value === "live" ? goLive() : pause()));
  document.getElementById("preview-form").addEventListener("submit", (e) => { e.preventDefault(); loadPreview(); });
  document.getElementById("trajectory-form").addEventListener("submit", (e) => {
    e.preventDefault();
    emit("open-trajectory", document.getElementById("trajectory-id").value);
  });
  for (const [id] of VIEWS) document.getElementById(`${id}-close`).addEventListener("click", () => close(id));
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") closeTopmost(); });
  for (const button of document.querySelectorAll("#timeline-mode button")) {
    button.addEventListener("click", () => {
      state.timelineMode = button.dataset.mode;
      for (const b of document.querySelectorAll("#timeline-mode button")) b.classList.toggle("on", b === button);
      if (state.summary) renderCollection(state.summary.collection);
    });
  }
  wireSteps();
  wireRewards();
  openLinked();
  refresh().then(goLive);
}

init();
