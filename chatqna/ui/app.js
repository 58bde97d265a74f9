// The chat page: conversation state, the composer, and the upload and API key panels.
// Every turn sends the whole conversation as OpenAI's `messages` list to `v1/chatqna` with
// `stream: true`; only answered turns join the history that later turns send.

import { ApiError, apiKey, fetchModels, ingestFiles, openChatStream } from "./api.js";
import { AssistantTurn, describeError, userTurn } from "./render.js";
import { readEvents } from "./sse.js";

const $ = (id) => document.getElementById(id);
const ui = {
  conversation: $("conversation"),
  empty: $("empty"),
  messages: $("messages"),
  composer: $("composer"),
  question: $("question"),
  send: $("send"),
  stop: $("stop"),
  newChat: $("new-chat"),
  announcer: $("announcer"),
  model: $("model"),
  uploadToggle: $("upload-toggle"),
  uploadPanel: $("upload-panel"),
  uploadForm: $("upload-form"),
  uploadFiles: $("upload-files"),
  uploadStatus: $("upload-status"),
  keyToggle: $("key-toggle"),
  keyPanel: $("key-panel"),
  keyForm: $("key-form"),
  keyInput: $("api-key"),
  keyForget: $("key-forget"),
  keyReason: $("key-reason"),
  keyStatus: $("key-status"),
};

const chat = {
  history: [], // answered turns only: {role, content}
  controller: null, // the running turn's AbortController
  generation: 0, // bumped by "New chat" so a late stream cannot write into the new one
  retryable: null, // the failed turn that Retry may resend
};

function announce(text) {
  ui.announcer.textContent = "";
  // A fresh node change makes screen readers repeat an identical message.
  requestAnimationFrame(() => {
    ui.announcer.textContent = text;
  });
}

function nearBottom() {
  const view = ui.conversation;
  return view.scrollHeight - view.scrollTop - view.clientHeight < 80;
}

function scrollToEnd() {
  ui.conversation.scrollTop = ui.conversation.scrollHeight;
}

function setBusy(busy) {
  const stopHadFocus = document.activeElement === ui.stop;
  const sendHadFocus = document.activeElement === ui.send;
  ui.send.hidden = busy;
  ui.stop.hidden = !busy;
  ui.composer.setAttribute("aria-busy", String(busy));
  if (busy && sendHadFocus) ui.stop.focus();
  if (!busy && stopHadFocus) ui.question.focus();
}

class StreamError extends Error {
  constructor(envelope) {
    super(envelope.message);
    this.streamEnvelope = envelope;
  }
}

/** Reads one turn's stream into `turn`; returns the answer text and finish reason. */
async function streamAnswer(messages, turn, controller, generation) {
  const response = await openChatStream(messages, controller.signal);
  let answer = "";
  let finish = null;
  for await (const { event, data } of readEvents(response)) {
    if (generation !== chat.generation) return null;
    if (event === "metadata") {
      const metadata = JSON.parse(data);
      turn.setRetrieval(metadata.retrieval);
      turn.setSources(metadata.source_documents);
      continue;
    }
    if (event === "error") throw new StreamError(JSON.parse(data));
    if (data === "[DONE]") return { answer, finish };
    const choice = JSON.parse(data).choices?.[0];
    const text = choice?.delta?.content;
    if (text) {
      const stick = nearBottom();
      answer += text;
      turn.append(text);
      if (stick) scrollToEnd();
    }
    if (choice?.finish_reason) finish = choice.finish_reason;
  }
  throw new StreamError({ error: "stream_cut", message: "The connection closed mid-answer." });
}

async function runTurn(question, history, turn) {
  const generation = chat.generation;
  const controller = new AbortController();
  chat.controller = controller;
  chat.retryable = null;
  setBusy(true);
  turn.start();
  const messages = [...history, { role: "user", content: question }];
  try {
    const result = await streamAnswer(messages, turn, controller, generation);
    if (result === null) return;
    turn.finish(result.finish);
    chat.history.push({ role: "user", content: question }, { role: "assistant", content: result.answer });
    announce("Answer complete.");
  } catch (error) {
    if (generation !== chat.generation) return;
    if (error.name === "AbortError") {
      turn.stopped();
      const partial = turn.answer.textContent;
      if (partial) chat.history.push({ role: "user", content: question }, { role: "assistant", content: partial });
      announce("Answer stopped.");
      return;
    }
    const hadFocus = document.activeElement === ui.question && !ui.question.value;
    const retry = turn.fail(describeError(error), () => {
      if (!chat.controller) runTurn(question, history, turn);
    });
    chat.retryable = turn;
    if (hadFocus) retry.focus();
    if (error instanceof ApiError && error.status === 401) keyRefused();
  } finally {
    if (chat.controller === controller) {
      chat.controller = null;
      setBusy(false);
    }
  }
}

function ask(question) {
  chat.retryable?.retire();
  chat.retryable = null;
  ui.empty.hidden = true;
  const turn = new AssistantTurn();
  ui.messages.append(userTurn(question), turn.element);
  scrollToEnd();
  runTurn(question, chat.history.slice(), turn);
}

function newChat() {
  chat.generation += 1;
  chat.controller?.abort();
  chat.controller = null;
  chat.history = [];
  chat.retryable = null;
  setBusy(false);
  ui.messages.replaceChildren();
  ui.empty.hidden = false;
  ui.question.value = "";
  ui.question.focus();
  announce("New chat started.");
}

// --- panels -----------------------------------------------------------------------------

function setPanel(toggle, panel, open) {
  panel.hidden = !open;
  toggle.setAttribute("aria-expanded", String(open));
}

function openKeyPanel(reason) {
  ui.keyToggle.hidden = false;
  ui.keyReason.textContent = reason;
  setPanel(ui.keyToggle, ui.keyPanel, true);
  ui.keyInput.focus();
}

// The browser signs in before the page loads, so a 401 here means a key saved in this tab
// is wrong, or the server's key changed since the sign-in.
function keyRefused() {
  openKeyPanel(
    apiKey.get()
      ? "The key saved in this tab was not accepted."
      : "The server did not accept this browser's sign-in. " +
          "Enter the API key, or reload the page to sign in again.",
  );
}

function wirePanel(toggle, panel, firstField) {
  toggle.addEventListener("click", () => {
    const open = panel.hidden;
    setPanel(toggle, panel, open);
    if (open) firstField.focus();
  });
  panel.addEventListener("keydown", (event) => {
    if (event.key === "Escape") {
      setPanel(toggle, panel, false);
      toggle.focus();
    }
  });
}

/** Asks `v1/models` for the model name; returns "ok", "unauthorized" or "unreachable". */
async function probeService() {
  try {
    const models = await fetchModels();
    const id = models.data?.[0]?.id;
    ui.model.hidden = !id;
    ui.model.textContent = id ? `Answers by ${id}` : "";
    if (apiKey.get()) ui.keyToggle.hidden = false;
    return "ok";
  } catch (error) {
    return error instanceof ApiError && error.status === 401 ? "unauthorized" : "unreachable";
  }
}

async function saveKey(event) {
  event.preventDefault();
  apiKey.set(ui.keyInput.value.trim());
  ui.keyStatus.dataset.state = "working";
  ui.keyStatus.textContent = "Checking…";
  const outcome = await probeService();
  if (outcome === "unauthorized") {
    ui.keyStatus.dataset.state = "failed";
    ui.keyStatus.textContent = "That key was not accepted.";
    ui.keyInput.select();
    return;
  }
  ui.keyStatus.textContent = "";
  ui.keyInput.value = "";
  setPanel(ui.keyToggle, ui.keyPanel, false);
  ui.question.focus();
  announce("API key saved for this tab.");
}

function describeIngest(result) {
  const files = result.files || [];
  const parts = files.map((f) => `${f.name} (${f.status}, ${f.chunks} chunk${f.chunks === 1 ? "" : "s"})`);
  return parts.length ? `Added ${parts.join(", ")}.` : "Nothing was added.";
}

async function upload(event) {
  event.preventDefault();
  const files = [...ui.uploadFiles.files];
  if (!files.length) {
    ui.uploadStatus.textContent = "Choose one or more files first.";
    ui.uploadFiles.focus();
    return;
  }
  const button = ui.uploadForm.querySelector("button[type=submit]");
  button.disabled = true;
  ui.uploadStatus.dataset.state = "working";
  ui.uploadStatus.textContent = `Uploading ${files.length} file${files.length === 1 ? "" : "s"}…`;
  try {
    const result = await ingestFiles(files);
    ui.uploadStatus.dataset.state = "done";
    ui.uploadStatus.textContent = describeIngest(result);
    ui.uploadForm.reset();
  } catch (error) {
    ui.uploadStatus.dataset.state = "failed";
    ui.uploadStatus.textContent = `Upload failed: ${describeError(error).text}`;
    if (error instanceof ApiError && error.status === 401) keyRefused();
  } finally {
    button.disabled = false;
  }
}

// --- wiring -----------------------------------------------------------------------------

ui.composer.addEventListener("submit", (event) => {
  event.preventDefault();
  const question = ui.question.value.trim();
  if (!question || chat.controller) return;
  ui.question.value = "";
  ask(question);
});

ui.question.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    ui.composer.requestSubmit();
  }
});

if (!CSS.supports("field-sizing", "content")) {
  // Grow the box with its text where CSS cannot.
  ui.question.addEventListener("input", () => {
    ui.question.style.height = "auto";
    ui.question.style.height = `${Math.min(ui.question.scrollHeight, 160)}px`;
  });
}

ui.stop.addEventListener("click", () => chat.controller?.abort());
ui.newChat.addEventListener("click", newChat);
wirePanel(ui.uploadToggle, ui.uploadPanel, ui.uploadFiles);
wirePanel(ui.keyToggle, ui.keyPanel, ui.keyInput);
ui.uploadForm.addEventListener("submit", upload);
ui.keyForm.addEventListener("submit", saveKey);
ui.keyForget.addEventListener("click", () => {
  apiKey.set("");
  ui.keyInput.value = "";
  ui.keyStatus.dataset.state = "done";
  ui.keyStatus.textContent = "Key forgotten.";
});

document.documentElement.dataset.ready = "true";
probeService().then((outcome) => {
  if (outcome === "unauthorized") keyRefused();
});
