// Chat messages as a person reads them: who spoke, the text, the tools called and what they returned.
// Understands OpenAI chat messages (content string or parts, tool_calls, role "tool") and Anthropic
// content blocks (text, tool_use, tool_result); anything else is shown as its JSON.

import { el, pre } from "./dom.js";

function parsedArguments(args) {
  if (typeof args !== "string") return args;
  try { return JSON.parse(args); } catch (_) { return args; }
}

function toolCall(name, args, id) {
  const value = parsedArguments(args);
  return el("div", { class: "tool-call" },
    el("span", { class: "tool-name" }, `→ ${name || "?"}`), id ? el("span", { class: "muted" }, ` ${id}`) : null,
    el("pre", {}, typeof value === "string" ? value : JSON.stringify(value, null, 2)));
}

function toolResult(content, id) {
  return el("div", { class: "tool-result" },
    el("span", { class: "tool-name" }, "← result"), id ? el("span", { class: "muted" }, ` ${id}`) : null,
    el("pre", {}, contentText(content)));
}

// The plain text of a content value (string, parts or blocks), for places that show text only.
export function contentText(content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content.map((part) => (typeof part === "string" ? part
      : part && typeof part.text === "string" ? part.text
        : part && part.type === "tool_result" ? contentText(part.content) : JSON.stringify(part))).join("\n");
  }
  return JSON.stringify(content, null, 2);
}

function contentNodes(content) {
  if (content === null || content === undefined || content === "") return [];
  if (!Array.isArray(content)) return [el("pre", { class: "text" }, contentText(content))];
  return content.map((part) => {
    if (part && part.type === "tool_use") return toolCall(part.name, part.input, part.id);
    if (part && part.type === "tool_result") return toolResult(part.content, part.tool_use_id);
    return el("pre", { class: "text" }, contentText([part]));
  });
}

// OpenAI tool calls ({function: {name, arguments}}) or the normalized ones a step stores.
export function toolCalls(calls) {
  if (!Array.isArray(calls)) return [];
  return calls.map((c) => (c && c.function ? toolCall(c.function.name, c.function.arguments, c.id)
    : toolCall(c && c.name, c && (c.arguments ?? c.input), c && c.id)));
}

export function message(m) {
  if (!m || typeof m !== "object") return el("div", { class: "message" }, pre(m));
  const role = m.role || "?";
  const body = m.role === "tool" ? [toolResult(m.content, m.tool_call_id)]
    : [...contentNodes(m.content), ...toolCalls(m.tool_calls)];
  return el("div", { class: `message role-${role}` },
    el("div", { class: "role" }, role, m.name ? ` (${m.name})` : ""),
    body.length ? body : el("div", { class: "empty" }, "(empty)"));
}

// A captured prompt: a message list, {messages: [...]}, or anything else shown as captured.
export function messages(prompt) {
  const list = Array.isArray(prompt) ? prompt : prompt && Array.isArray(prompt.messages) ? prompt.messages : null;
  if (!list) return pre(prompt || "");
  return list.map(message);
}
