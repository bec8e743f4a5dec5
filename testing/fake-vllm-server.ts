import { existsSync, readFileSync, statSync } from 'node:fs';
import { readBody } from './read-body';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { dirname, join } from 'node:path';
import type { ChatRequest } from './chat-server';
import { createChatResponder, type FakeMode, type RecordedRequest } from './fake-policy-server';
import { fakeTokenize, withFreeWhitespace } from './fake-whitespace';
import { effectiveSampling, QWEN3_VL_GENERATION_CONFIG, samplingError, serverDefaults } from './fake-vllm-sampling';
import { byteLevelVocab, DEFAULT_VOCAB, type FakeVocab } from './fake-vocab';
import type { VllmServer } from '../lib/model-io/grammar-blob';
import { constrainedCandidates } from './fake-constrained';
import { xgrammarReady, xgrammarWrite } from './xgrammar-writer';
import { askPython } from './python-lines';
import { encodePrompt, PROMPT_ENCODER } from './model-prompt-ids';
import { fakePromptTokenIds } from './fake-vllm-sampling';

/**
 * A local stand-in for vLLM's runtime LoRA API (`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`, v0.11–0.15 era
 * `vllm/entrypoints/openai/serving_models.py` + `serve/lora/api_router.py`), same routes, bodies and status codes:
 *
 * - `POST /v1/load_lora_adapter {lora_name, lora_path, load_inplace?}`: 200 text
 *   `Success: LoRA adapter '<name>' added successfully.`; name taken (no load_inplace) → 400 InvalidUserInput
 *   `The lora adapter '<name>' has already been loaded. …`; folder or adapter_config.json missing → 404
 *   NotFoundError `Loading lora <name> failed: No adapter found for <path>`; no adapter_model.safetensors →
 *   400 BadRequestError `<path> doesn't contain tensors`; an `adapter_config.json` whose `r` (or a `rank_pattern`
 *   value) is above `maxLoraRank` (`--max-lora-rank`, default 16) → 500 InternalServerError `Call to add_lora method
 *   failed: LoRA rank R is greater than max_lora_rank M.` (0.33: lora/peft_helper.py validate_legal, raised in the
 *   engine core, v1/engine/core.py, answered by entrypoints/openai/models/serving.py as a 500).
 * - `POST /v1/unload_lora_adapter {lora_name}`: 200 text `… removed successfully.`; unknown → 404 NotFoundError
 *   `The lora adapter '<name>' cannot be found.`
 * - `GET /v1/models`: `{"object": "list", "data": [base card, one card per adapter (root = path, parent = base)]}`.
 * - `POST /v1/chat/completions`: `model` must be the base model or a loaded adapter (empty = base), else 404
 *   NotFoundError `The model \`<name>\` does not exist.` (param "model", as from 0.14). Answers come from the
 *   scripted fake model (fake-policy-server.ts), with `token_ids` and `logprobs.content` when asked
 *   (`return_token_ids`, `logprobs`, `return_tokens_as_token_ids`); `legacyTokens` plays a server older than
 *   0.10.2, which ignores `return_token_ids`. With `return_token_ids` the answer carries the prompt's ids
 *   (top-level `prompt_token_ids`): with a `tokenizer` in a model folder (beside its preprocessor_config.json), the
 *   model's own processor encodes them as vLLM does
 *   (prompt-encoder.py: chat template, images loaded as vLLM loads them); without, the fake's own encoding.
 * - Sampling (fake-vllm-sampling.ts): a field the request leaves out comes from `generationConfig` (default: Qwen3-VL's
 *   for a Qwen3-VL base model), unless `vllmGenerationConfig` (`--generation-config vllm`); the log-probs are then
 *   those of the cut distribution, and `chats[i].sampling` records what was sampled from. Values out of vLLM's
 *   ranges → 400 BadRequestError with `SamplingParams._verify_args`'s message. `logprobPlaceholders` reports that
 *   fraction (below 1) or count of log-prob positions as -9999, as vLLM clamps a missing or -inf one.
 * - `seed`: recorded with the request (`chats[i].seed`); `custom` answers draw from it (fake-policy-server.ts
 *   `choiceDraw`), so the same seed gives the same completions, as vLLM's per-request generator does.
 * - Images (`image_url` parts): taken as they come, unless `maxImagesPerPrompt` is set (`--limit-mm-per-prompt`:
 *   more image parts → 400 BadRequestError `At most <N> image(s) may be provided in one prompt.`, param "image"; 0
 *   plays a text-only server) or `checkImages` is on (a data URL whose bytes are no PNG, JPEG, GIF or WebP → 400
 *   BadRequestError `cannot identify image file <_io.BytesIO object at 0x…>`, PIL's complaint that vLLM passes on).
 * - Constrained answers (`structured_outputs.json`): the bare JSON value of the scripted action that the schema admits
 *   (fake-constrained.ts), written by xgrammar itself through a matcher compiled with the call of the release
 *   `server` plays (xgrammar-writer.ts; default vLLM 0.33, `compile_json_schema(spec, any_whitespace=False,
 *   separators=(",", ":"))` compact: `{"a":1}`; vllm-0.31 without separators: `{"a": 1}`), then the end of turn; a
 *   meant value xgrammar refuses gives way to the first value the schema admits. With free whitespace unless
 *   `disableAnyWhitespace` (the server flag; the request's `disable_any_whitespace` is ignored, as vLLM does):
 *   fake-whitespace.ts.
 * - Log-probs: processed (`--logprobs-mode processed_logprobs`, as ./launch.sh gpu and compose start vLLM: after
 *   temperature and truncation), or with `rawLogprobs` vLLM's default raw_logprobs (the model's own, whatever the
 *   temperature). `POST /tokenize
 *   {prompt}` gives the fake tokenizer's ids.
 * - Token ids: a made-up byte vocabulary, or with `tokenizer` (a byte-level BPE `tokenizer.json`, e.g. the learner's
 *   tiny model's; `setTokenizer` when it exists only after the server started) the model's own single-byte tokens
 *   and its `<|im_end|>` (fake-vocab.ts): ids the model's tokenizer and xgrammar accept.
 * - `restart()`: what a restarted vLLM remembers of its runtime adapters: nothing.
 * - Errors: `{"error": {"message", "type", "param": null, "code": <status>}}`; non-JSON bodies → 415 like
 *   vLLM's `validate_json_request`. With `runtimeLoraUpdating: false` the two POST routes do not exist
 *   (FastAPI's 404 `{"detail": "Not Found"}`), as when the environment variable is unset.
 */
export interface FakeVllmServer {
  url: string;
  baseModel: string;
  /** name → path of the loaded adapters, in load order. */
  adapters: Map<string, string>;
  /** Every request, in order; chat bodies without their `messages` (images), which `chats` summarises. */
  requests: { method: string; path: string; body: unknown }[];
  /** Chat requests that reached the model (known model name): the model named and the token fields asked for. */
  chats: RecordedRequest[];
  /** With `recordMessages`: the `messages` of each chat request in `chats`, as sent (images as data URLs). */
  messages: unknown[][];
  /** Chat requests refused because the model was unknown, by name. */
  unknownModels: string[];
  /** Times `restart()` was called. */
  restarts: number;
  setMode(mode: FakeMode): void;
  /** Answers in the ids of this byte-level BPE `tokenizer.json` from now on (the `tokenizer` start option). */
  setTokenizer(tokenizerJson: string): void;
  /** Added to every chat answer (a real model's latency). */
  delayMs: number;
  /** The next `count` requests answer this status with a vLLM-shaped error (e.g. 500, 503). */
  failNext(status: number, count?: number): void;
  /** Forgets every runtime-loaded adapter, as a restarted vLLM does. */
  restart(): void;
  close(): Promise<void>;
}

/** The largest rank an adapter folder declares (`r` and `rank_pattern`, as PEFTHelper reads them); none for a placeholder. */
function adapterRank(dir: string): number | undefined {
  const cfg = JSON.parse(readFileSync(join(dir, 'adapter_config.json'), 'utf8')) as { r?: unknown; rank_pattern?: unknown };
  const ranks = [cfg.r, ...Object.values((cfg.rank_pattern ?? {}) as Record<string, unknown>)].filter((r): r is number => typeof r === 'number');
  return ranks.length ? Math.max(...ranks) : undefined;
}

export async function startFakeVllmServer(
  opts: {
    baseModel?: string;
    runtimeLoraUpdating?: boolean;
    port?: number;
    mode?: FakeMode;
    legacyTokens?: boolean;
    recordMessages?: boolean;
    /** `--limit-mm-per-prompt image=<N>`: more image parts in one request are refused (0: a text-only server). */
    maxImagesPerPrompt?: number;
    /** Refuse images whose bytes no image decoder knows, as vLLM (PIL) does. */
    checkImages?: boolean;
    /** `--structured-outputs-config '{"disable_any_whitespace":true}'`; default false, vLLM's: constrained answers hold free whitespace (fake-whitespace.ts). */
    disableAnyWhitespace?: boolean;
    /** The model's generation_config.json sampling fields; default Qwen3-VL's when the base model is a Qwen3-VL, else none. */
    generationConfig?: Record<string, number>;
    /** `--generation-config vllm`: the model's generation config is not applied. */
    vllmGenerationConfig?: boolean;
    /** Log-prob positions reported as -9999: a fraction (below 1) or a count. */
    logprobPlaceholders?: number;
    /** A byte-level BPE `tokenizer.json`: ids are its single-byte tokens and its `<|im_end|>` (default: made-up ids). */
    tokenizer?: string;
    /** The vLLM release played, whose xgrammar call writes constrained answers (default vllm-0.33). */
    server?: VllmServer;
    /** `--logprobs-mode raw_logprobs`, vLLM's default (default here: processed_logprobs, the flag launch passes). */
    rawLogprobs?: boolean;
    /** `--max-lora-rank` (vLLM's default 16). */
    maxLoraRank?: number;
  } = {},
): Promise<FakeVllmServer> {
  const baseModel = opts.baseModel ?? 'Qwen/Qwen3-VL-8B-Instruct';
  const adapters = new Map<string, string>();
  const requests: FakeVllmServer['requests'] = [];
  const unknownModels: string[] = [];
  // Off by default: screenshots make each request's messages large.
  const messages: unknown[][] = [];
  const chat = createChatResponder(opts.mode ?? { kind: 'scripted' });
  const created = Math.floor(Date.now() / 1000);
  const ph = opts.logprobPlaceholders;
  if (ph !== undefined && !(ph >= 0 && (ph < 1 || Number.isInteger(ph)))) throw new Error(`logprobPlaceholders must be a fraction in [0, 1) or a whole count, got ${ph}`);
  const defaults = serverDefaults(opts.generationConfig ?? (/qwen3-vl/i.test(baseModel) ? QWEN3_VL_GENERATION_CONFIG : {}), opts.vllmGenerationConfig ?? false);
  let failing: { status: number; count: number } | undefined;
  let vocab: FakeVocab = opts.tokenizer ? byteLevelVocab(opts.tokenizer) : DEFAULT_VOCAB;
  // Given the model (a tokenizer.json beside its preprocessor_config.json), prompts are encoded by its own processor,
  // as vLLM encodes them.
  const modelOf = (tokenizer: string | undefined) => (tokenizer && existsSync(join(dirname(tokenizer), 'preprocessor_config.json')) ? dirname(tokenizer) : undefined);
  let modelDir = modelOf(opts.tokenizer);
  const promptIds = async (body: ChatRequest): Promise<number[]> => {
    if (!modelDir) return fakePromptTokenIds(body, vocab);
    return encodePrompt(modelDir, body);
  };
  const release = opts.server ?? 'vllm-0.33';
  const constrain = async (schema: Record<string, unknown>, modelText: string): Promise<string> => {
    const refused: string[] = [];
    for (const text of constrainedCandidates(schema, modelText)) {
      try {
        return (await xgrammarWrite({ schema, release, disableAnyWhitespace: opts.disableAnyWhitespace ?? false, text })).text;
      } catch (err) {
        refused.push((err as Error).message);
      }
    }
    throw new Error(`the stand-in found no answer xgrammar accepts: ${refused.join('; ')}`);
  };
  const maxLoraRank = opts.maxLoraRank ?? 16;

  const server = createServer((req, res) => {
    void handle(req, res).catch((err) => sendError(res, 500, 'InternalServerError', String(err)));
  });

  async function handle(req: IncomingMessage, res: ServerResponse) {
    const path = (req.url ?? '/').split('?')[0];
    const raw = await readBody(req);
    let body: unknown;
    try {
      body = raw ? JSON.parse(raw) : undefined;
    } catch {
      body = raw;
    }
    const isChat = req.method === 'POST' && path === '/v1/chat/completions' && typeof body === 'object' && body !== null;
    requests.push({ method: req.method ?? 'GET', path, body: isChat ? { ...(body as object), messages: undefined } : body });
    if (failing && failing.count > 0) {
      failing.count--;
      const type = failing.status >= 500 ? 'InternalServerError' : 'BadRequestError';
      return sendError(res, failing.status, type, `injected failure (HTTP ${failing.status})`);
    }

    if (req.method === 'GET' && path === '/v1/models') {
      const permission = [
        {
          id: 'modelperm-fake',
          object: 'model_permission',
          created,
          allow_create_engine: false,
          allow_sampling: true,
          allow_logprobs: true,
          allow_search_indices: false,
          allow_view: true,
          allow_fine_tuning: false,
          organization: '*',
          group: null,
          is_blocking: false,
        },
      ];
      const card = (id: string, root: string, parent: string | null, maxLen: number | null) => ({
        id,
        object: 'model',
        created,
        owned_by: 'vllm',
        root,
        parent,
        max_model_len: maxLen,
        permission,
      });
      return sendJson(res, 200, {
        object: 'list',
        data: [card(baseModel, baseModel, null, 8192), ...[...adapters].map(([id, p]) => card(id, p, baseModel, null))],
      });
    }

    // vLLM's tokenizer route (serve/tokenize/api_router.py): `{model?, prompt}` → `{count, max_model_len, tokens, token_strs}`.
    if (req.method === 'POST' && path === '/tokenize') {
      const b = (typeof body === 'object' && body !== null ? body : {}) as { model?: unknown; prompt?: unknown };
      if (typeof b.model === 'string' && b.model && b.model !== baseModel && !adapters.has(b.model)) {
        return sendJson(res, 404, { error: { message: `The model \`${b.model}\` does not exist.`, type: 'NotFoundError', param: 'model', code: 404 } });
      }
      if (typeof b.prompt !== 'string') return sendError(res, 400, 'BadRequestError', 'prompt: Field required');
      return sendJson(res, 200, fakeTokenize(b.prompt, 8192, vocab));
    }

    if (req.method === 'GET' && path === '/health') {
      res.writeHead(200, { 'content-length': 0 });
      return res.end();
    }

    if (path === '/v1/chat/completions') {
      if (req.method !== 'POST') return sendJson(res, 405, { detail: 'Method Not Allowed' });
      if (!isChat) return sendError(res, 400, 'BadRequestError', 'Invalid JSON body');
      const model = (body as { model?: unknown }).model;
      const name = typeof model === 'string' ? model : '';
      if (name && name !== baseModel && !adapters.has(name)) {
        unknownModels.push(name);
        return sendJson(res, 404, { error: { message: `The model \`${name}\` does not exist.`, type: 'NotFoundError', param: 'model', code: 404 } });
      }
      const imageError = imagePartsError(body as Record<string, unknown>, opts);
      if (imageError) return sendJson(res, 400, { error: { message: imageError.message, type: 'BadRequestError', param: imageError.param, code: 400 } });
      const constraint = structuredOutputsError(body as Record<string, unknown>);
      if (constraint) return sendError(res, 400, 'BadRequestError', constraint);
      const sampling = samplingError(effectiveSampling(body as ChatRequest, defaults));
      if (sampling) return sendJson(res, 400, { error: { message: sampling.message, type: 'BadRequestError', param: sampling.param, code: 400 } });
      if (opts.recordMessages) messages.push((body as { messages?: unknown[] }).messages ?? []);
      const out = await chat.answer(body as ChatRequest, {
        legacyTokens: opts.legacyTokens,
        defaults,
        logprobPlaceholders: opts.logprobPlaceholders,
        vocab,
        constrain,
        promptIds,
        rawLogprobs: opts.rawLogprobs,
      });
      const reply = opts.disableAnyWhitespace ? out : withFreeWhitespace(out, body as Record<string, unknown>, vocab);
      return sendJson(res, reply.status, reply.body);
    }

    const lora = (path === '/v1/load_lora_adapter' || path === '/v1/unload_lora_adapter') && opts.runtimeLoraUpdating !== false;
    if (!lora) return sendJson(res, 404, { detail: 'Not Found' });
    if (req.method !== 'POST') return sendJson(res, 405, { detail: 'Method Not Allowed' });
    if (!(req.headers['content-type'] ?? '').toLowerCase().startsWith('application/json')) {
      return sendError(res, 415, 'Unsupported Media Type', "Unsupported Media Type: Only 'application/json' is allowed");
    }
    if (typeof body !== 'object' || body === null) return sendError(res, 400, 'BadRequestError', 'Invalid JSON body');
    const b = body as { lora_name?: unknown; lora_path?: unknown; load_inplace?: unknown };

    if (path === '/v1/load_lora_adapter') {
      const name = typeof b.lora_name === 'string' ? b.lora_name : '';
      const lpath = typeof b.lora_path === 'string' ? b.lora_path : '';
      if (!name || !lpath) return sendError(res, 400, 'InvalidUserInput', "Both 'lora_name' and 'lora_path' must be provided.");
      if (adapters.has(name) && b.load_inplace !== true) {
        return sendError(res, 400, 'InvalidUserInput', `The lora adapter '${name}' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.`);
      }
      if (!isDir(lpath) || !existsSync(join(lpath, 'adapter_config.json'))) {
        return sendError(res, 404, 'NotFoundError', `Loading lora ${name} failed: No adapter found for ${lpath}`);
      }
      if (!existsSync(join(lpath, 'adapter_model.safetensors')) && !existsSync(join(lpath, 'adapter_model.bin'))) {
        return sendError(res, 400, 'BadRequestError', `${lpath} doesn't contain tensors`);
      }
      const rank = adapterRank(lpath);
      if (rank !== undefined && rank > maxLoraRank) {
        return sendError(res, 500, 'InternalServerError', `Call to add_lora method failed: LoRA rank ${rank} is greater than max_lora_rank ${maxLoraRank}.`);
      }
      adapters.set(name, lpath);
      return sendText(res, `Success: LoRA adapter '${name}' added successfully.`);
    }

    const name = typeof b.lora_name === 'string' ? b.lora_name : '';
    if (!name) return sendError(res, 400, 'InvalidUserInput', "'lora_name' needs to be provided to unload a LoRA adapter.");
    if (!adapters.has(name)) return sendError(res, 404, 'NotFoundError', `The lora adapter '${name}' cannot be found.`);
    adapters.delete(name);
    return sendText(res, `Success: LoRA adapter '${name}' removed successfully.`);
  }

  // Constrained answers come from xgrammar: its import (seconds, once per process) happens before the first request.
  await xgrammarReady();
  if (modelDir) {
    const ready = await askPython(PROMPT_ENCODER, [modelDir], { ping: true });
    if (ready.ready !== true) throw new Error(`the stand-in's prompt encoder did not start for ${modelDir}: ${ready.error}`);
  }
  await new Promise<void>((resolve) => server.listen(opts.port ?? 0, '127.0.0.1', resolve));
  const port = (server.address() as { port: number }).port;
  const api: FakeVllmServer = {
    url: `http://127.0.0.1:${port}`,
    baseModel,
    adapters,
    requests,
    chats: chat.requests,
    messages,
    unknownModels,
    restarts: 0,
    setMode: (m) => chat.setMode(m),
    setTokenizer(tokenizerJson) {
      vocab = byteLevelVocab(tokenizerJson);
      modelDir = modelOf(tokenizerJson);
      // The encoder's imports start now, not on the first request.
      if (modelDir) void askPython(PROMPT_ENCODER, [modelDir], { ping: true });
    },
    get delayMs() {
      return chat.delayMs;
    },
    set delayMs(ms: number) {
      chat.delayMs = ms;
    },
    failNext(status, count = 1) {
      failing = { status, count };
    },
    restart() {
      adapters.clear();
      api.restarts++;
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
  return api;
}

/** The kinds of `structured_outputs` constraint (vLLM's StructuredOutputsParams): a request names exactly one. */
export const STRUCTURED_OUTPUT_KINDS = ['json', 'regex', 'choice', 'grammar', 'json_object', 'structural_tag'] as const;
const STRUCTURED_OUTPUT_OPTIONS = ['disable_any_whitespace', 'disable_additional_properties', 'whitespace_pattern', 'disable_fallback'];

/**
 * vLLM's checks on `structured_outputs` (0.11+): an object with exactly one constraint, a schema that is an object
 * or a non-empty string, no unknown keys. The `guided_*` fields it replaced are not checked: from 0.12 on vLLM
 * ignores them silently (HTTP 200, unconstrained output), which is why tests assert they are never sent.
 */
export function structuredOutputsError(body: Record<string, unknown>): string | undefined {
  const so = body.structured_outputs;
  if (so === undefined || so === null) return undefined;
  if (typeof so !== 'object' || Array.isArray(so)) return 'structured_outputs: Input should be a valid dictionary';
  const keys = Object.keys(so);
  const unknown = keys.filter((k) => !(STRUCTURED_OUTPUT_KINDS as readonly string[]).includes(k) && !STRUCTURED_OUTPUT_OPTIONS.includes(k));
  if (unknown.length) return `structured_outputs.${unknown[0]}: Extra inputs are not permitted`;
  const kinds = keys.filter((k) => (STRUCTURED_OUTPUT_KINDS as readonly string[]).includes(k) && (so as Record<string, unknown>)[k] != null);
  if (kinds.length === 0) return 'You must use one kind of structured outputs constraint but none are specified';
  if (kinds.length > 1) return `You can only use one kind of structured outputs constraint but multiple are specified: ${kinds.join(', ')}`;
  const json = (so as Record<string, unknown>).json;
  if (json !== undefined && !((typeof json === 'object' && json !== null && !Array.isArray(json)) || (typeof json === 'string' && json.length > 0))) {
    return 'structured_outputs.json must be a JSON schema object or a non-empty string';
  }
  return undefined;
}

/** The URLs of a chat request's `image_url` parts, in order. */
function imageUrls(body: Record<string, unknown>): string[] {
  const out: string[] = [];
  for (const m of Array.isArray(body.messages) ? body.messages : []) {
    const content = (m as { content?: unknown })?.content;
    if (!Array.isArray(content)) continue;
    for (const part of content) {
      const p = part as { type?: unknown; image_url?: { url?: unknown } | string };
      if (p?.type !== 'image_url') continue;
      out.push(typeof p.image_url === 'string' ? p.image_url : String(p.image_url?.url ?? ''));
    }
  }
  return out;
}

/** PNG, JPEG, GIF, WebP by their first bytes. */
function knownImage(bytes: Buffer): boolean {
  const png = bytes.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]));
  const jpeg = bytes[0] === 0xff && bytes[1] === 0xd8 && bytes[2] === 0xff;
  const gif = bytes.subarray(0, 4).toString('latin1') === 'GIF8';
  const webp = bytes.subarray(0, 4).toString('latin1') === 'RIFF' && bytes.subarray(8, 12).toString('latin1') === 'WEBP';
  return png || jpeg || gif || webp;
}

/** vLLM's refusals of a request's images (`--limit-mm-per-prompt`, undecodable bytes); undefined when it takes them. */
function imagePartsError(body: Record<string, unknown>, opts: { maxImagesPerPrompt?: number; checkImages?: boolean }): { message: string; param: string | null } | undefined {
  const urls = imageUrls(body);
  if (opts.maxImagesPerPrompt !== undefined && urls.length > opts.maxImagesPerPrompt) {
    return { message: `At most ${opts.maxImagesPerPrompt} image(s) may be provided in one prompt.`, param: 'image' };
  }
  if (!opts.checkImages) return undefined;
  for (const url of urls) {
    const m = /^data:image\/[A-Za-z0-9.+-]+;base64,(.*)$/s.exec(url);
    if (m && !knownImage(Buffer.from(m[1], 'base64'))) return { message: 'cannot identify image file <_io.BytesIO object at 0x7f3a2c1d5e40>', param: null };
  }
  return undefined;
}

function isDir(p: string): boolean {
  try {
    return statSync(p).isDirectory();
  } catch {
    return false;
  }
}

function sendJson(res: ServerResponse, status: number, body: unknown) {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

/** vLLM's `ErrorResponse`: `{"error": {"message", "type", "param", "code"}}` with code = the HTTP status. */
function sendError(res: ServerResponse, status: number, type: string, message: string) {
  sendJson(res, status, { error: { message, type, param: null, code: status } });
}

/** Success answers are a bare string body (FastAPI `Response(content=...)`, no media type). */
function sendText(res: ServerResponse, text: string) {
  res.writeHead(200, { 'content-length': Buffer.byteLength(text) });
  res.end(text);
}
