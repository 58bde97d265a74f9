// Requests to the ChatQnA API. With an API key set on the server, the browser's own sign-in
// (HTTP Basic, asked for when the page loads) goes with every request on its own; a key
// entered in the page's panel, kept in this tab's session storage, is sent as Bearer instead.
// URLs start with the page's `chatqna-base`: the server's root path (`/chat/`), so the calls
// stay under a reverse proxy's path prefix whether or not the page's URL ends with `/`; or
// nothing without a root path, and then they are relative to the page.

const KEY_NAME = "chatqna.apiKey";
const BASE = document.querySelector('meta[name="chatqna-base"]')?.content ?? "";

/** The absolute URL of the API's `path`, without any `user:password@`: opened as
 * `http://user:key@host/`, the page's base URL keeps them, and `fetch` refuses such URLs.
 * The browser has cached that sign-in and sends it anyway. */
function endpoint(path) {
  const url = new URL(BASE + path, document.baseURI);
  url.username = "";
  url.password = "";
  return url.href;
}

/** An HTTP error answered with the service's envelope: `{error, message, [reason]}`. */
export class ApiError extends Error {
  constructor(status, envelope) {
    super(envelope.message || `HTTP ${status}`);
    this.status = status;
    this.envelope = envelope;
  }
}

export const apiKey = {
  get() {
    return sessionStorage.getItem(KEY_NAME) || "";
  },
  set(value) {
    if (value) sessionStorage.setItem(KEY_NAME, value);
    else sessionStorage.removeItem(KEY_NAME);
  },
};

function headers(extra = {}) {
  const key = apiKey.get();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

async function failure(response) {
  let envelope;
  try {
    envelope = await response.json();
  } catch {
    envelope = null;
  }
  if (!envelope || typeof envelope.error !== "string") {
    envelope = { error: "http_error", message: `The server answered HTTP ${response.status}.` };
  }
  return new ApiError(response.status, envelope);
}

/** Starts a streamed turn; resolves to the open response once the status is known. */
export async function openChatStream(messages, signal) {
  const response = await fetch(endpoint("v1/chatqna"), {
    method: "POST",
    headers: headers({ "Content-Type": "application/json", Accept: "text/event-stream" }),
    body: JSON.stringify({ messages, stream: true }),
    signal,
  });
  if (!response.ok) throw await failure(response);
  return response;
}

/** `POST v1/dataprep/ingest` with each file as a multipart field named `files`. */
export async function ingestFiles(files) {
  const form = new FormData();
  for (const file of files) form.append("files", file, file.name);
  const response = await fetch(endpoint("v1/dataprep/ingest"), {
    method: "POST",
    headers: headers(),
    body: form,
  });
  if (!response.ok) throw await failure(response);
  return response.json();
}

/** `GET v1/models`: the answering model, and a cheap probe of whether the key is needed. */
export async function fetchModels() {
  const response = await fetch(endpoint("v1/models"), { headers: headers() });
  if (!response.ok) throw await failure(response);
  return response.json();
}
