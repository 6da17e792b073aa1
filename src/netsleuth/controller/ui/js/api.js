// The same HTTP API the CLI uses. The token lives in sessionStorage (gone when the tab closes) and goes in
// the Authorization header; the live stream is read with fetch() because EventSource cannot send headers.

const TOKEN_KEY = "netsleuth.token";
const BASE = "/api/v1";

export class ApiError extends Error {
  /** `field` and `problem`: the config field the controller refused and what is wrong with it, apart from the
   * sentence (which names the CLI's flag), so a form can mark its own field and word it with its label. */
  constructor(status, message, { field = null, problem = null } = {}) {
    super(message);
    this.status = status;
    this.field = field;
    this.problem = problem;
  }
}

export function getToken() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(token) {
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
}

function headers(extra = {}) {
  const out = { Accept: "application/json", ...extra };
  const token = getToken();
  if (token) out.Authorization = `Bearer ${token}`;
  return out;
}

/** The server's refusal as an ApiError: its one sentence ({"error": ...}; FastAPI's own {"detail": ...} as a
 * fallback) and, when it names one, the field to blame. */
async function refusal(res) {
  try {
    const body = await res.json();
    const field = typeof body.field === "string" ? { field: body.field, problem: String(body.problem ?? body.error) } : {};
    if (typeof body.error === "string") return new ApiError(res.status, body.error, field);
    if (typeof body.detail === "string") return new ApiError(res.status, body.detail);
    if (Array.isArray(body.detail) && body.detail[0]?.msg) return new ApiError(res.status, body.detail[0].msg);
  } catch {
    /* not JSON: fall through to the status line */
  }
  return new ApiError(res.status, `The controller answered ${res.status} ${res.statusText || ""}`.trim() + ".");
}

export async function api(path, { method = "GET", body, signal } = {}) {
  const init = { method, headers: headers(), signal };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(BASE + path, init);
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, "The controller cannot be reached; check that it is running and try again.");
  }
  if (!res.ok) throw await refusal(res);
  if (res.status === 204) return null;
  const type = res.headers.get("Content-Type") || "";
  return type.includes("json") ? res.json() : res.text();
}

/** Fetch a file with the token and hand it to the browser as a download. */
export async function download(path, filename) {
  const res = await fetch(BASE + path, { headers: headers({ Accept: "*/*" }) });
  if (!res.ok) throw await refusal(res);
  const blob = await res.blob();
  const url = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = url;
  a.download = filename;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

/**
 * Read a server-sent event stream: calls onEvent(name, data) per event (data parsed as JSON when it is).
 * Resolves when the server closes the stream; rejects on HTTP errors with the server's sentence.
 */
export async function streamEvents(path, onEvent, { signal, lastEventId } = {}) {
  const extra = { Accept: "text/event-stream" };
  if (lastEventId) extra["Last-Event-ID"] = lastEventId;
  const res = await fetch(BASE + path, { headers: headers(extra), signal, cache: "no-store" });
  if (!res.ok) throw await refusal(res);
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let lastId = lastEventId;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    // Normalise CRLF (sse-starlette's default) but keep a trailing lone CR until its LF arrives.
    const keep = buffer.endsWith("\r") ? "\r" : "";
    if (buffer.includes("\r")) buffer = buffer.slice(0, buffer.length - keep.length).replace(/\r\n?/g, "\n");
    else if (keep) buffer = buffer.slice(0, -1);
    // Walk the chunk with an index and cut the buffer once: slicing per event would copy the rest of a
    // large chunk for every event in it (quadratic at thousands of events per chunk).
    let start = 0;
    let cut;
    while ((cut = buffer.indexOf("\n\n", start)) >= 0) {
      const block = buffer.slice(start, cut);
      start = cut + 2;
      let name = "message";
      let data = null;
      for (const line of block.split("\n")) {
        if (line.startsWith(":")) continue; // keep-alive comment
        const colon = line.indexOf(":");
        const key = colon < 0 ? line : line.slice(0, colon);
        let val = colon < 0 ? "" : line.slice(colon + 1);
        if (val.startsWith(" ")) val = val.slice(1);
        if (key === "event") name = val;
        else if (key === "data") data = data === null ? val : `${data}\n${val}`;
        else if (key === "id") lastId = val;
      }
      if (data === null) continue;
      let parsed = data;
      try {
        parsed = JSON.parse(data);
      } catch {
        /* plain text event */
      }
      onEvent(name, parsed, lastId);
    }
    buffer = buffer.slice(start) + keep;
  }
  return lastId;
}
