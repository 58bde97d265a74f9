// Server-Sent Events over fetch: EventSource cannot POST a body or send an Authorization
// header, so the chat stream is read from `response.body` and parsed here.

/** Splits event-stream text into `{event, data}` records; feed it chunks as they arrive. */
export class EventParser {
  constructor() {
    this.buffer = "";
    this.carriageReturn = false; // a chunk ended in "\r": its "\n" may start the next one
  }

  /** Returns the events completed by `text` (a chunk may end mid-event; the rest waits). */
  push(text) {
    let incoming = this.carriageReturn ? `\r${text}` : text;
    this.carriageReturn = incoming.endsWith("\r");
    if (this.carriageReturn) incoming = incoming.slice(0, -1);
    this.buffer += incoming.replace(/\r\n?/g, "\n");
    const blocks = this.buffer.split("\n\n");
    this.buffer = blocks.pop();
    return blocks.map(parseBlock).filter((record) => record !== null);
  }

  /** The last event, if the stream ended without its blank line. */
  flush() {
    const rest = this.buffer + (this.carriageReturn ? "\n" : "");
    this.carriageReturn = false;
    this.buffer = "";
    const record = rest.trim() ? parseBlock(rest) : null;
    return record === null ? [] : [record];
  }
}

function parseBlock(block) {
  let event = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line === "" || line.startsWith(":")) continue; // comments keep proxies awake
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") event = value;
    else if (field === "data") data.push(value);
  }
  return data.length ? { event, data: data.join("\n") } : null;
}

/** Yields the events of a fetch `Response` whose body is `text/event-stream`. */
export async function* readEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  const parser = new EventParser();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      yield* parser.push(value);
    }
    yield* parser.flush();
  } finally {
    reader.releaseLock();
  }
}
