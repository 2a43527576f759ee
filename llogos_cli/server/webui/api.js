// The server's public API, as any client calls it: relative URLs, so the page works wherever the
// server is mounted, and the API key as a bearer token.

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function headers(key) {
  const h = { 'Content-Type': 'application/json' };
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

async function failure(response) {
  const body = await response.json().catch(() => ({}));
  return new ApiError(response.status, body.error?.message ?? `${response.status} ${response.statusText}`);
}

export async function getJson(path, key) {
  const response = await fetch(path, { headers: headers(key) });
  if (!response.ok) throw await failure(response);
  return response.json();
}

function events(buffer) {
  const parts = buffer.split('\n\n');
  return [parts.slice(0, -1), parts.at(-1)];
}

// POSTs a streamed chat completion and hands each choice's delta to onDelta as it arrives. Resolves
// with what the last chunks carry: the finish reason, llama-server's timings, and the usage.
export async function streamChat(body, key, signal, onDelta) {
  const response = await fetch('v1/chat/completions', {
    method: 'POST', headers: headers(key), body: JSON.stringify(body), signal,
  });
  if (!response.ok) throw await failure(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  const end = { finish: null, timings: null, usage: null };
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return end;
    let complete;
    [complete, buffer] = events(buffer + value);
    for (const event of complete) {
      const data = event.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trim()).join('');
      if (!data || data === '[DONE]') continue;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new ApiError(500, chunk.error.message);
      end.timings = chunk.timings ?? end.timings;
      end.usage = chunk.usage ?? end.usage;
      for (const choice of chunk.choices ?? []) {
        onDelta(choice.delta ?? {});
        end.finish = choice.finish_reason ?? end.finish;
      }
    }
  }
}
