// The DOM of the conversation: user turns, assistant turns with their retrieval report,
// streamed answer and sources, and the failure prompt. Text from the server is only ever
// set with `textContent`, never parsed as HTML.

import { ApiError } from "./api.js";

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

/** Scores print with three significant digits: 0.607, 5.11, 0.0328, 0.600. */
export function formatScore(value) {
  if (typeof value !== "number" || !Number.isFinite(value)) return "–";
  if (value === 0) return "0";
  return value.toPrecision(3);
}

const quote = (text) => `“${text}”`;
const plural = (count, word) => `${count} ${word}${count === 1 ? "" : "s"}`;

const BLEND_SKIPS = {
  disabled: ["Blend off", "blending is switched off (MULTI_TURN_BLEND_ENABLED)"],
  no_history: ["Blend skipped", "no earlier messages to blend"],
  history_turns_zero: ["Blend skipped", "the history window is 0 (MULTI_TURN_HISTORY_TURNS)"],
  self_contained: [
    "Searched alone",
    "alike to the previous question, so it names its subject (MULTI_TURN_SELF_CONTAINED_SIMILARITY)",
  ],
};

/**
 * What retrieval searched for, from the metadata event's `retrieval` object:
 * `{badge, ran, summary, rows}` where `rows` are [label, value] pairs for the details list.
 */
export function describeRetrieval(retrieval) {
  const rows = [["Mode", retrieval.multi_turn_mode], ["Strategy", retrieval.strategy]];
  let badge;
  let ran = false;
  let summary;
  const condense = retrieval.condense;
  const blend = retrieval.blend;
  if (condense) {
    ran = condense.status === "ok";
    if (ran) {
      badge = "Rewritten";
      summary = `Searched for ${quote(condense.standalone_query)}, rewritten from ${quote(
        condense.raw_query,
      )}`;
    } else {
      badge = "As asked";
      summary = `Searched for ${quote(retrieval.query)}: first question, nothing to rewrite`;
    }
    rows.push(["Condense", condense.status]);
    if (ran) {
      rows.push(["Standalone query", condense.standalone_query]);
      rows.push(["Rewrite", `${condense.model || "LLM"}, ${Math.round(condense.latency_ms)} ms`]);
    }
    rows.push(["History sent", plural(condense.history_size, "message")]);
  } else if (blend) {
    ran = Boolean(blend.executed);
    if (ran) {
      badge = "Blend ran";
      summary =
        `Searched for ${quote(retrieval.raw_query)} blended with ` +
        `${plural(blend.history_messages, "earlier message")} · α ${blend.alpha}`;
    } else {
      const [label, why] = BLEND_SKIPS[blend.reason] || ["Blend skipped", blend.reason];
      badge = label;
      summary = `Searched for ${quote(retrieval.raw_query)} as asked: ${why}`;
    }
    rows.push(["Blend", ran ? "ran" : `not run (${blend.reason})`]);
    rows.push(["Alpha (query weight)", String(blend.alpha)]);
    rows.push(["History window", plural(blend.history_turns, "message")]);
    if (ran) rows.push(["Messages blended", String(blend.history_messages)]);
    if (blend.question_similarity != null) {
      rows.push(["Similarity to the previous question", blend.question_similarity.toFixed(2)]);
    }
    const history = retrieval.bm25_history;
    if (history) {
      rows.push(["BM25 history leg", history.ran ? `ran, weight ${history.weight}` : "not run"]);
    }
  } else {
    badge = "As asked";
    summary = `Searched for ${quote(retrieval.query)}`;
  }
  rows.push(["BM25 query", retrieval.query]);
  rows.push(["Search", retrieval.hybrid ? "dense + BM25, fused (RRF)" : "dense only"]);
  const rerank = retrieval.rerank;
  if (rerank && rerank.ran) {
    rows.push(["Reranker", `${retrieval.reranker} (${rerank.query_kind} query)`]);
    rows.push(["Rerank query", rerank.query]);
  } else if (rerank) {
    const why = rerank.reason === "embedded_default" ? "fused order kept" : "off";
    rows.push(["Reranker", `none (${why})`]);
  } else {
    rows.push(["Reranker", retrieval.reranker || "off"]);
  }
  rows.push(["Depth", `${retrieval.k} retrieved, ${retrieval.top_n} kept`]);
  return { badge, ran, summary, rows };
}

const CONDENSE_REASONS = {
  timeout: "the rewriting model did not answer in time",
  http_error: "the rewriting model returned an error or could not be reached",
  bad_body: "the rewriting model sent a reply that could not be read",
  missing_field: "the rewriting model's reply had no text",
  empty_query: "the rewrite came back empty",
};

/** Title, text and detail for a failed turn. */
export function describeError(error) {
  if (error instanceof ApiError) {
    const envelope = error.envelope;
    if (envelope.error === "condense_failed") {
      const why = CONDENSE_REASONS[envelope.reason] || "the rewrite failed";
      return {
        title: "This follow-up could not be rewritten for search",
        text: envelope.message,
        detail: `Reason: ${envelope.reason} (${why}). Nothing was answered from the wrong passages.`,
      };
    }
    if (error.status === 401) {
      return {
        title: "API key needed",
        text: "This server needs an API key. Enter it with the API key button, then retry.",
        detail: envelope.message,
      };
    }
    return { title: "The service could not answer", text: envelope.message, detail: "" };
  }
  if (error && error.streamEnvelope) {
    return { title: "The answer stopped early", text: error.streamEnvelope.message, detail: "" };
  }
  return {
    title: "Could not reach the service",
    text: "Check that the server is running, then retry.",
    detail: error && error.message ? error.message : "",
  };
}

/** A user's message, as it appears in the conversation. */
export function userTurn(text) {
  const item = el("li", "turn turn-user");
  const bubble = el("div", "bubble");
  bubble.append(el("span", "visually-hidden", "You asked: "), el("span", "user-text", text));
  item.append(bubble);
  return item;
}

function sourceItem(doc, rank) {
  const item = el("li", "source");
  const details = el("details");
  const summary = el("summary");
  const name = el("span", "source-name", doc.source);
  const title = el("span", "source-title", doc.title || "");
  const score = el("span", "score", formatScore(doc.score));
  score.title = "final score";
  summary.append(el("span", "source-rank", `${rank}`), name, title, score);
  const body = el("div", "source-body");
  body.append(el("p", "source-text", doc.text));
  const scores = el("dl", "score-list");
  for (const [stage, value] of Object.entries(doc.scores || {})) {
    const pair = el("div");
    pair.append(el("dt", "", stage), el("dd", "", formatScore(value)));
    scores.append(pair);
  }
  body.append(scores);
  details.append(summary, body);
  item.append(details);
  return item;
}

/** One assistant turn: its state moves from searching to streaming to done or failed. */
export class AssistantTurn {
  constructor() {
    this.element = el("li", "turn turn-assistant");
    const bubble = el("article", "bubble");
    bubble.setAttribute("aria-label", "Answer");
    this.retrieval = el("details", "retrieval");
    this.retrieval.hidden = true;
    this.progress = el("p", "progress");
    this.answer = el("div", "answer");
    // The answer region is announced when it stops being busy, not once per token.
    this.answer.setAttribute("aria-live", "polite");
    this.problem = el("div", "problem");
    this.problem.setAttribute("role", "alert");
    this.sources = el("section", "sources");
    this.sources.hidden = true;
    bubble.append(this.retrieval, this.progress, this.answer, this.problem, this.sources);
    this.element.append(bubble);
    this.start();
  }

  /** (Re)starts the turn: a retry begins from a clean slate. */
  start() {
    this.element.dataset.state = "searching";
    this.retrieval.hidden = true;
    this.retrieval.replaceChildren();
    this.sources.hidden = true;
    this.sources.replaceChildren();
    this.problem.replaceChildren();
    this.answer.textContent = "";
    this.answer.setAttribute("aria-busy", "true");
    this.progress.hidden = false;
    this.progress.textContent = "Searching the knowledge base…";
  }

  setRetrieval(retrieval) {
    if (!retrieval) return;
    const described = describeRetrieval(retrieval);
    const summary = el("summary");
    const badge = el("span", `badge ${described.ran ? "badge-ran" : "badge-skipped"}`);
    badge.textContent = described.badge;
    summary.append(badge, el("span", "retrieval-summary", described.summary));
    const list = el("dl", "retrieval-details");
    for (const [label, value] of described.rows) {
      const pair = el("div");
      pair.append(el("dt", "", label), el("dd", "", value === null ? "–" : String(value)));
      list.append(pair);
    }
    this.retrieval.replaceChildren(summary, list);
    this.retrieval.dataset.ran = String(described.ran);
    this.retrieval.hidden = false;
    this.element.dataset.state = "streaming";
    this.progress.textContent = "Writing the answer…";
  }

  setSources(documents) {
    const docs = documents || [];
    const heading = el("h2", "sources-heading", docs.length ? "Sources" : "No sources found");
    const list = el("ol", "source-list");
    docs.forEach((doc, index) => list.append(sourceItem(doc, index + 1)));
    this.sources.replaceChildren(heading, list);
    this.sources.hidden = false;
  }

  append(text) {
    this.progress.hidden = true;
    this.answer.append(text);
  }

  finish(finishReason) {
    this.element.dataset.state = "done";
    this.progress.hidden = finishReason !== "length";
    if (finishReason === "length") this.progress.textContent = "The answer reached its length limit.";
    this.answer.normalize();
    this.answer.setAttribute("aria-busy", "false");
  }

  stopped() {
    this.element.dataset.state = "stopped";
    this.progress.hidden = false;
    this.progress.textContent = "Stopped.";
    this.answer.setAttribute("aria-busy", "false");
  }

  /** Shows why the turn failed, with a Retry button that calls `onRetry`. */
  fail(description, onRetry) {
    this.element.dataset.state = "failed";
    this.progress.hidden = true;
    this.answer.setAttribute("aria-busy", "false");
    const retry = el("button", "button primary retry", "Retry");
    retry.type = "button";
    retry.addEventListener("click", onRetry);
    const parts = [el("p", "problem-title", description.title), el("p", "problem-text", description.text)];
    if (description.detail) parts.push(el("p", "problem-detail", description.detail));
    parts.push(retry);
    this.problem.replaceChildren(...parts);
    return retry;
  }

  /** A failed turn that a newer question has overtaken can no longer be retried. */
  retire() {
    if (this.element.dataset.state !== "failed") return;
    this.problem.querySelector(".retry")?.remove();
    this.problem.append(el("p", "problem-detail", "Not answered."));
    this.element.dataset.state = "abandoned";
  }
}
