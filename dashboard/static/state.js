// What the page remembers between redraws, and how its parts ask each other for something.
// Panels never call the views they open: they emit a named action ("filter", "open-step",
// "open-trajectory", ...) and app.js routes it, so no module imports its way round in a circle.

export const state = {
  summary: null, // the last /v1/dashboard/summary
  timelineMode: "kind", // the timeline's series: by source "kind" or by source "source" name
  filters: {}, // the latest-steps table's filters
  offset: 0, // the latest-steps table's first row
  total: 0, // steps matching the filters
  selected: new Set(), // step ids ticked for curation
  busy: false, // a summary refresh is in flight
  live: null, // the AbortController of the live stream; null while paused
  lagHistory: [], // [{t, groups: {name: behind_ready}}], newest last
  pages: {}, // the page each paged table shows, by table name, kept across redraws
  rewards: { version: undefined, filter: "" }, // the version picked in the rewards view; its table filter
};

const handlers = new Map();

// Registers what an action does (app.js does this once for each action).
export function on(action, handler) {
  handlers.set(action, handler);
}

// Asks for an action; an action nobody handles is a programming error, reported loudly.
export function emit(action, ...args) {
  const handler = handlers.get(action);
  if (!handler) throw new Error(`no handler for dashboard action ${action}`);
  return handler(...args);
}
