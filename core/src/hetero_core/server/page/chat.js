// The chat page's client (served by hetero_core/server/page.py). Plain browser JavaScript: it talks to
// the server's OpenAI API like any client: /v1/models for the model, /v1/chat/completions streamed
// (server-sent events read with fetch and a ReadableStream), /metrics for a few gauges. When the API
// answers 401, the page asks for the key, keeps it in sessionStorage and sends it as a bearer token.
"use strict";

const KEY_STORAGE = "hetero.apiKey";
const METRICS_PERIOD_MS = 3000;
const state = { model: null, messages: [], controller: null };
const $ = (id) => document.getElementById(id);

function authHeaders(extra = {}) {
  const key = sessionStorage.getItem(KEY_STORAGE);
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

// OpenAI's error JSON ({"error": {"message": ...}}) as its message, anything else as status and text.
async function errorMessage(response) {
  const text = await response.text();
  try {
    const message = JSON.parse(text).error.message;
    if (message) return message;
  } catch (_) { /* not OpenAI's error JSON */ }
  return `${response.status} ${response.statusText}${text ? ": " + text.slice(0, 300) : ""}`;
}

function showError(message) {
  $("error").textContent = message || "";
  $("error").hidden = !message;
}

function askForKey(reason) {
  $("key-reason").textContent = reason;
  $("key-form").hidden = false;
  $("send").disabled = true;
  $("api-key").focus();
}

async function loadModel() {
  let response;
  try {
    response = await fetch("/v1/models", { headers: authHeaders() });
  } catch (error) {
    showError(`cannot reach the server: ${error.message}`);
    return;
  }
  if (response.status === 401) return askForKey(await errorMessage(response));
  if (!response.ok) return showError(await errorMessage(response));
  const card = (await response.json()).data[0];
  state.model = card.id;
  $("model").textContent = card.id;
  $("model-detail").textContent = card.max_model_len ? `(up to ${card.max_model_len} tokens)` : "";
  $("key-form").hidden = true;
  $("send").disabled = false;
  showError("");
  $("prompt").focus();
}

// The schema box as a response_format, or null when it is empty; a mistake throws a readable Error.
function responseFormat() {
  const text = $("schema").value.trim();
  if (!text) return null;
  let schema;
  try {
    schema = JSON.parse(text);
  } catch (error) {
    throw new Error(`JSON schema: not valid JSON (${error.message})`);
  }
  if (typeof schema !== "object" || schema === null || Array.isArray(schema)) {
    throw new Error("JSON schema: must be a JSON object, such as {\"type\": \"object\"}");
  }
  const name = /^[A-Za-z0-9_-]{1,64}$/.test(schema.title || "") ? schema.title : "answer";
  return { type: "json_schema", json_schema: { name, schema } };
}

function numberField(id, label, parse) {
  const value = parse($(id).value);
  if (!Number.isFinite(value)) throw new Error(`${label}: enter a number`);
  return value;
}

function requestBody(format) {
  const system = $("system").value.trim();
  const body = {
    model: state.model,
    messages: system ? [{ role: "system", content: system }, ...state.messages] : [...state.messages],
    stream: true,
    stream_options: { include_usage: true },
    temperature: numberField("temperature", "Temperature", parseFloat),
    max_tokens: numberField("max-tokens", "Max tokens", (v) => parseInt(v, 10)),
  };
  if (format) body.response_format = format;
  return body;
}

function addMessage(role, text) {
  const node = document.createElement("div");
  node.className = `message ${role}`;
  node.textContent = text;
  $("log").append(node);
  node.scrollIntoView({ block: "end" });
  return node;
}

// Each event's data (the lines after "data:"), as the stream brings them.
async function* sseData(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer = (buffer + value).replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block.split("\n").filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, "")).join("\n");
      if (data) yield data;
    }
  }
}

function setBusy(busy) {
  $("send").disabled = busy || state.model === null;
  $("stop").disabled = !busy;
}

function showAnswerMetrics(startedAt, firstAt, endedAt, usage, finish) {
  const seconds = (endedAt - startedAt) / 1000;
  const generated = usage ? usage.completion_tokens : null;
  $("metric-tps").textContent = generated && seconds > 0 ? (generated / seconds).toFixed(1) : "–";
  $("metric-ttft").textContent = firstAt === null ? "–" : `${Math.round(firstAt - startedAt)} ms`;
  $("metric-usage").textContent = usage ? `${usage.prompt_tokens} / ${usage.completion_tokens}` : "–";
  $("metric-finish").textContent = finish || "–";
}

async function send(event) {
  event.preventDefault();
  const question = $("prompt").value.trim();
  if (!question || state.controller || state.model === null) return;
  let body;
  try {
    state.messages.push({ role: "user", content: question });
    body = requestBody(responseFormat());
  } catch (error) {
    state.messages.pop();
    return showError(error.message);
  }
  showError("");
  $("prompt").value = "";
  const asked = addMessage("user", question);
  const answer = addMessage("assistant", "");
  answer.dataset.state = "streaming";
  state.controller = new AbortController();
  setBusy(true);
  const startedAt = performance.now();
  let firstAt = null, text = "", usage = null, finish = null;
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: authHeaders({ "Content-Type": "application/json" }),
      body: JSON.stringify(body),
      signal: state.controller.signal,
    });
    if (response.status === 401) {
      const reason = await errorMessage(response);
      askForKey(reason);
      throw new Error(reason);
    }
    if (!response.ok) throw new Error(await errorMessage(response));
    for await (const data of sseData(response)) {
      if (data === "[DONE]") break;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      for (const choice of chunk.choices || []) {
        const piece = choice.delta && choice.delta.content;
        if (piece) {
          if (firstAt === null) firstAt = performance.now();
          text += piece;
          answer.textContent = text;
          answer.scrollIntoView({ block: "end" });
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
      if (chunk.usage) usage = chunk.usage;
    }
    state.messages.push({ role: "assistant", content: text });
    answer.dataset.state = "done";
  } catch (error) {
    if (error.name === "AbortError") {  // stopped: the partial answer stays (unless "New chat" stopped it)
      if (answer.isConnected) state.messages.push({ role: "assistant", content: text });
      answer.dataset.state = "stopped";
      finish = "stopped";
    } else {  // failed: the question goes back to the box, to edit or send again
      state.messages.pop();
      asked.remove();
      answer.remove();
      $("prompt").value = question;
      showError(error.message);
    }
  } finally {
    state.controller = null;
    setBusy(false);
  }
  showAnswerMetrics(startedAt, firstAt, performance.now(), usage, finish);
  refreshServerMetrics();
}

// A few of /metrics' Prometheus lines ("name value"; no labels on these).
async function refreshServerMetrics() {
  if (document.hidden) return;
  let text;
  try {
    const response = await fetch("/metrics");
    if (!response.ok) return;
    text = await response.text();
  } catch (_) {
    return;  // the server is gone or restarting; the next refresh tries again
  }
  const values = {};
  for (const line of text.split("\n")) {
    const match = /^(hetero_[a-z_]+) ([0-9.eE+-]+)$/.exec(line);
    if (match) values[match[1]] = Number(match[2]);
  }
  const show = (...names) => names.map((n) => (n in values ? Math.round(values[n]) : "?")).join(" / ");
  $("gauge-requests").textContent = show("hetero_requests_running", "hetero_requests_waiting");
  $("gauge-kv").textContent = show("hetero_kv_blocks_used", "hetero_kv_blocks_total");
  $("gauge-tokens").textContent = show("hetero_generation_tokens_total");
}

function start() {
  $("prompt-form").addEventListener("submit", send);
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      $("prompt-form").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => state.controller && state.controller.abort());
  $("clear").addEventListener("click", () => {
    if (state.controller) state.controller.abort();
    state.messages = [];
    $("log").replaceChildren();
    showError("");
  });
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY_STORAGE, $("api-key").value.trim());
    $("api-key").value = "";
    loadModel();
  });
  loadModel();
  refreshServerMetrics();
  setInterval(refreshServerMetrics, METRICS_PERIOD_MS);
}

start();
