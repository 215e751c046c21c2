// The dashboard's side of the HTTP API: JSON reads and writes carrying the API key when the server
// asks for one, and the live stream of pulses (Server-Sent Events read through fetch, so the key rides
// along: EventSource cannot send headers).

const API = "v1/dashboard"; // relative to the page, so the dashboard also works behind a path prefix

// With CLAWR1_API_KEYS set, data needs a key allowed to read the pool (and to curate, for writes):
// asked once, kept for the tab.
const KEY_STORE = "clawr1.apiKey";
const asking = { now: false, declined: false };

function authHeaders(extra) {
  const headers = { Accept: "application/json", ...extra };
  const key = sessionStorage.getItem(KEY_STORE);
  if (key) headers.Authorization = `Bearer ${key}`;
  return headers;
}

async function request(url, init) {
  const response = await fetch(url, { ...init, headers: authHeaders(init.headers) });
  if ((response.status === 401 || response.status === 403) && !asking.now && !asking.declined) {
    asking.now = true;
    const given = window.prompt(`This Claw-R1 API needs a key for ${url.split("?")[0]} (kind read, or curate):`);
    asking.now = false;
    if (given) {
      sessionStorage.setItem(KEY_STORE, given.trim());
      return request(url, init);
    }
    asking.declined = true; // no re-asking on every refresh; reload the page to try again
  }
  if (!response.ok) {
    let reason = response.statusText;
    try { reason = JSON.stringify(await response.json()); } catch (_) { /* keep the status text */ }
    throw new Error(`${response.status} from ${url}: ${reason}`);
  }
  return response;
}

export async function getJson(path) {
  return (await request(`${API}/${path}`, { method: "GET" })).json();
}

export async function sendJson(path, body) {
  const init = { method: "POST", body: JSON.stringify(body), headers: { "Content-Type": "application/json" } };
  return (await request(`${API}/${path}`, init)).json();
}

// A path segment for an id that may hold a slash ("svc/turn-0").
export const segment = (id) => encodeURIComponent(id);

// Reads /live until `signal` aborts: onPulse() on each `event: pulse`, onStatus("live"|"connecting"|
// "reconnecting") as the connection moves, onError(err) when it drops; reconnects after 2 s.
export async function followLive(signal, { onPulse, onStatus, onError }) {
  while (!signal.aborted) {
    try {
      onStatus("connecting");
      const response = await request(`${API}/live`, { method: "GET", signal, headers: { Accept: "text/event-stream" } });
      onStatus("live");
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          if (block.startsWith("event: pulse")) onPulse();
        }
      }
    } catch (err) {
      if (signal.aborted) return;
      onError(err);
    }
    if (signal.aborted) return;
    onStatus("reconnecting");
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
}
