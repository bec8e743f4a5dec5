import { createServer, type Server } from 'node:http';
import { readBody } from './read-body';

/**
 * A chat completions request body as our clients send it, with the fields the fakes read. It is parsed JSON: the
 * shape is assumed, not checked.
 */
export interface ChatRequest {
  model: string;
  messages?: { role: string; content: string | ChatRequestPart[] }[];
  n?: number;
  temperature: number;
  max_tokens: number;
  logprobs?: boolean;
  return_token_ids?: boolean;
  return_tokens_as_token_ids?: boolean;
  top_p?: number | null;
  top_k?: number | null;
  min_p?: number | null;
  presence_penalty?: number | null;
  frequency_penalty?: number | null;
  repetition_penalty?: number | null;
  /** vLLM's per-request generator seed. */
  seed?: number | null;
  /** vLLM's constrained decoding; the fakes read its `json` schema (fake-constrained.ts). */
  structured_outputs?: { json?: unknown } | null;
}

/** One part of a user message's content: text, or an image as a data URL. */
export interface ChatRequestPart {
  type: string;
  text?: string;
  image_url?: { url?: string };
}

/** An HTTP status and the JSON body to answer with. */
export interface JsonReply {
  status: number;
  body: unknown;
}

/** A `chat.completion` answer around `choices`, in the shape the OpenAI client parses; `extra`: top-level fields (vLLM's `prompt_token_ids`). */
export function chatCompletion(id: string, model: string, choices: unknown[], extra: Record<string, unknown> = {}): JsonReply {
  return {
    status: 200,
    body: {
      id,
      object: 'chat.completion',
      created: Math.floor(Date.now() / 1000),
      model,
      choices,
      usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
      ...extra,
    },
  };
}

export interface ChatServer {
  /** The OpenAI base URL (`http://127.0.0.1:<port>/v1`). */
  url: string;
  close(): Promise<void>;
}

/**
 * The HTTP side of an OpenAI-compatible fake on a free local port: `GET /v1/models` lists `modelId`, and each
 * `POST /v1/chat/completions` body goes to `answer`; any other route is a 404, a body that is not JSON a 400
 * (both in OpenAI's error shape, which the client turns into its typed errors).
 */
export async function startChatServer(modelId: string, answer: (body: ChatRequest) => Promise<JsonReply> | JsonReply): Promise<ChatServer> {
  const server: Server = createServer(async (req, res) => {
    const send = (status: number, body: unknown) => {
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(JSON.stringify(body));
    };
    if (req.method === 'GET' && req.url === '/v1/models') return send(200, { object: 'list', data: [{ id: modelId, object: 'model' }] });
    if (req.method !== 'POST' || req.url !== '/v1/chat/completions') return send(404, { error: { message: 'not found' } });
    let body: ChatRequest;
    try {
      body = JSON.parse(await readBody(req));
    } catch {
      return send(400, { error: { message: 'body is not JSON', type: 'BadRequestError' } });
    }
    const out = await answer(body);
    send(out.status, out.body);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return {
    url: `http://127.0.0.1:${(server.address() as { port: number }).port}/v1`,
    close: () => new Promise((r) => server.close(() => r())),
  };
}
