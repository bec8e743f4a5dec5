import { createHash } from 'node:crypto';
import { chatCompletion, startChatServer, type ChatRequest, type JsonReply } from './chat-server';
import { constrainedAnswer, jsonSchemaOf } from './fake-constrained';
import { effectiveSampling, fakePromptTokenIds, placeholderPositions, truncatedLogprob, type EffectiveSampling } from './fake-vllm-sampling';
import { answerIds, DEFAULT_VOCAB, tokenText, type FakeVocab } from './fake-vocab';

/**
 * A local stand-in for vLLM's OpenAI-compatible chat endpoint. It reads the goal and the accessibility
 * tree from the prompt our prompt builder wrote and answers like a (very simple) model would:
 * - `scripted`: a Qwen computer-use tool call that solves simple MiniWoB tasks from the tree;
 * - `garbage`: prose with no action in it;
 * - `custom`: `answer` writes choice `choice` of a request from the parsed prompt (to script branching policies),
 *   with that choice's draw from the request's `seed` (`choiceDraw`: the same seed, the same answers);
 * - `status`: an HTTP error with the given status.
 * Asked for `logprobs` / `return_token_ids` / `return_tokens_as_token_ids`, it answers with vLLM's token fields
 * (`vllmTokenFields`), ids from a byte-level stand-in tokenizer (`fakeTokenIds`, or the model's own byte tokens:
 * fake-vocab.ts), and the prompt's ids (`prompt_token_ids`) with `return_token_ids`. A request with
 * `structured_outputs.json` gets the bare JSON of what the model meant, as the grammar allows it (fake-constrained.ts).
 */
export interface EmailScript {
  to: string;
  subject: string;
  body: string;
}
export type FakeMode =
  | { kind: 'scripted'; email?: EmailScript }
  | { kind: 'garbage' }
  | {
      kind: 'custom';
      /** `random`: this choice's draw in [0, 1), from the request's `seed` when it has one (`choiceDraw`). */
      answer: (p: { goal: string; tree: TreeLine[]; previous: string[]; choice: number; temperature: number; random: number }) => string;
    }
  | { kind: 'status'; status: number };

export interface RecordedRequest {
  model: string;
  n: number;
  temperature: number;
  maxTokens: number;
  hasImage: boolean;
  goal: string;
  /** The token fields the request asked for (vLLM extensions), as sent: undefined when left out. */
  logprobs?: boolean;
  returnTokenIds?: boolean;
  returnTokensAsTokenIds?: boolean;
  /** vLLM's per-request `seed`, as sent. */
  seed?: number | null;
  /** The distribution the request was sampled from: its fields over the server's defaults (fake-vllm-sampling.ts). */
  sampling: EffectiveSampling;
}

/** How a server answers beyond the request: a server older than 0.10.2, its sampling defaults, -9999 placeholders. */
export interface AnswerOptions {
  legacyTokens?: boolean;
  defaults?: Partial<EffectiveSampling>;
  /** Log-prob positions reported as -9999: a fraction (below 1) or a count. */
  logprobPlaceholders?: number;
  /** The ids text is written in (default: the made-up byte vocabulary). */
  vocab?: FakeVocab;
  /** The compact separators of constrained answers (default xgrammar's `", "`/`": "`: a server compiling without them). */
  separators?: [string, string];
  /** `--logprobs-mode raw_logprobs` (vLLM's default): the model's log-probs before temperature and truncation. */
  rawLogprobs?: boolean;
  /** Writes a constrained answer as the server's grammar lets the model (the vLLM stand-in: xgrammar); default `constrainedAnswer` with `separators`. */
  constrain?: (schema: Record<string, unknown>, modelText: string) => Promise<string>;
  /** The prompt's ids as the server's model encodes it (the vLLM stand-in given a model); default `fakePromptTokenIds`. */
  promptIds?: (body: ChatRequest) => Promise<number[]>;
}

export interface FakePolicyServer {
  url: string;
  requests: RecordedRequest[];
  setMode(mode: FakeMode): void;
  /** Added to every answer, to stand in for a real model's latency. */
  delayMs: number;
  /** Called before answering request number `index` (0-based); the answer waits for it. */
  onRequest?: (index: number) => Promise<void> | void;
  close(): Promise<void>;
}

export interface TreeLine {
  id: number;
  role: string;
  name: string;
  x: number;
  y: number;
  value?: string;
}

export function parseTree(text: string): TreeLine[] {
  const out: TreeLine[] = [];
  for (const line of text.split('\n')) {
    const m = /\[(\d+)\]\s+(\S+)(?:\s+"((?:[^"\\]|\\.)*)")?.*@\((\d+),\s*(\d+)\)/.exec(line);
    const value = /value="((?:[^"\\]|\\.)*)"/.exec(line)?.[1];
    if (m) out.push({ id: Number(m[1]), role: m[2], name: m[3] ?? '', x: Number(m[4]), y: Number(m[5]), ...(value !== undefined ? { value } : {}) });
  }
  return out;
}

export const toolCall = (args: Record<string, unknown>) => `<tool_call>\n${JSON.stringify({ name: 'computer_use', arguments: args })}\n</tool_call>`;

/** A mail client flow (REAL gomail-like sites): compose, fill To/Subject/Body, send, then answer. */
function emailAnswer(email: EmailScript, lines: TreeLine[]): string | undefined {
  const field = (label: string) => lines.find((l) => l.role === 'textbox' && l.name === label);
  if (lines.some((l) => /message sent/i.test(l.name))) return toolCall({ action: 'answer', text: `Sent the email to ${email.to}.` });
  const to = field('To');
  if (!to) {
    const compose = lines.find((l) => l.role === 'button' && l.name === 'Compose');
    return compose ? toolCall({ action: 'click_element', element_id: compose.id }) : undefined;
  }
  for (const [label, text] of [
    ['To', email.to],
    ['Subject', email.subject],
    ['Body', email.body],
  ] as const) {
    const f = field(label);
    if (f && !f.value) return toolCall({ action: 'type', element_id: f.id, text });
  }
  const send = lines.find((l) => l.role === 'button' && l.name === 'Send');
  return send ? toolCall({ action: 'left_click', coordinate: [send.x, send.y] }) : undefined;
}

/** The scripted "model": enough to solve click-button (by coordinates), enter-text and a compose-and-send mail task. */
export function scriptedAnswer(goal: string, tree: string, previous: string[], email?: EmailScript): string {
  const lines = parseTree(tree);
  if (email) {
    const answer = emailAnswer(email, lines);
    if (answer) return answer;
  }
  const clickGoal = /Click on the "(.+?)" button/i.exec(goal);
  if (clickGoal) {
    const target = lines.find((l) => l.role === 'button' && l.name === clickGoal[1]);
    if (target) return `I will click the ${clickGoal[1]} button.\n${toolCall({ action: 'left_click', coordinate: [target.x, target.y] })}`;
  }
  const enter = /Enter "(.+?)" into the text field/i.exec(goal);
  if (enter) {
    const typed = previous.some((p) => p.startsWith('type'));
    const box = lines.find((l) => l.role === 'textbox');
    const submit = lines.find((l) => l.role === 'button' && /submit/i.test(l.name));
    if (!typed && box) return toolCall({ action: 'type', element_id: box.id, text: enter[1] });
    if (submit) return toolCall({ action: 'left_click', coordinate: [submit.x, submit.y] });
  }
  return toolCall({ action: 'wait', time: 0 });
}

export { FAKE_BYTE_OFFSET, FAKE_EOS_ID } from './fake-vocab';

/**
 * The fake's default tokenizer: one id per UTF-8 byte (`FAKE_BYTE_OFFSET + byte`), then `FAKE_EOS_ID` when the
 * answer ended by itself (vLLM's `token_ids` include the end-of-turn token).
 */
export function fakeTokenIds(text: string, finishReason: string): number[] {
  return answerIds(DEFAULT_VOCAB, text, finishReason);
}

/**
 * Choice `i`'s draw in [0, 1): as vLLM seeds one generator per request with its `seed`, the same seed gives every
 * choice the same draw again; a request without one draws afresh.
 */
export function choiceDraw(seed: number | null | undefined, i: number): number {
  if (seed == null) return Math.random();
  return createHash('sha256').update(`${seed}:${i}`).digest().readUInt32BE(0) / 2 ** 32;
}

/** A made-up but deterministic log-prob per position: different tokens, different values, all in [-0.9, -0.01]. */
export function fakeLogprob(id: number, position: number): number {
  return -(1 + ((id * 31 + position * 7) % 90)) / 100;
}

/**
 * The per-choice token fields vLLM adds when asked (`vllm/entrypoints/openai` chat protocol): `token_ids` with
 * `return_token_ids` (unless `legacy`, a server older than 0.10.2 that lacks it), and `logprobs.content` with
 * `logprobs`, its `token` written as `"token_id:N"` with `return_tokens_as_token_ids`. The log-probs are those of
 * the distribution sampled from (`sampling`: cut by top-k/top-p/min-p, `truncatedLogprob`), -9999 at placeholders.
 */
export function vllmTokenFields(
  text: string,
  finishReason: string,
  body: ChatRequest,
  legacy = false,
  opts: { sampling?: EffectiveSampling; logprobPlaceholders?: number; vocab?: FakeVocab } = {},
): Record<string, unknown> {
  const vocab = opts.vocab ?? DEFAULT_VOCAB;
  const ids = answerIds(vocab, text, finishReason);
  const out: Record<string, unknown> = {};
  if (body.return_token_ids === true && !legacy) out.token_ids = ids;
  if (body.logprobs === true) {
    const asIds = body.return_tokens_as_token_ids === true;
    const unknown = placeholderPositions(ids.length, opts.logprobPlaceholders);
    out.logprobs = {
      content: ids.map((id, t) => {
        const token = asIds ? `token_id:${id}` : tokenText(vocab, id);
        const lp = unknown.has(t) ? -9999 : opts.sampling ? truncatedLogprob(fakeLogprob(id, t), opts.sampling) : fakeLogprob(id, t);
        return { token, logprob: lp, bytes: [...Buffer.from(token, 'latin1')], top_logprobs: [] };
      }),
    };
  }
  return out;
}

/** What a policy prompt (lib/model-io/prompt.ts) tells a model: the goal, the tree as text and the actions taken so far. */
export function promptOf(body: ChatRequest): { hasImage: boolean; goal: string; tree: string; previous: string[] } {
  const content = (body.messages ?? []).find((m) => m.role === 'user')?.content;
  const parts = Array.isArray(content) ? content : [];
  const text = parts
    .filter((p) => p.type === 'text')
    .map((p) => p.text)
    .join('\n');
  return {
    hasImage: parts.some((p) => p.type === 'image_url' && /^data:image\/png;base64,/.test(p.image_url?.url ?? '')),
    goal: /^Goal: (.*)$/m.exec(text)?.[1] ?? '',
    tree: /Accessibility tree:\n([\s\S]*?)\n\nPrevious actions:/.exec(text)?.[1] ?? '',
    previous: [...(/Previous actions:\n([\s\S]*?)\n\n/.exec(text)?.[1] ?? '').matchAll(/^\d+\. (.*)$/gm)].map((m) => m[1]),
  };
}

/** A chat request as recorded: what our system asked for. */
function record(body: ChatRequest, hasImage: boolean, goal: string, sampling: EffectiveSampling): RecordedRequest {
  return {
    model: body.model,
    n: body.n ?? 1,
    temperature: body.temperature,
    maxTokens: body.max_tokens,
    hasImage,
    goal,
    logprobs: body.logprobs,
    returnTokenIds: body.return_token_ids,
    returnTokensAsTokenIds: body.return_tokens_as_token_ids,
    seed: body.seed,
    sampling,
  };
}

export interface ChatResponder {
  requests: RecordedRequest[];
  setMode(mode: FakeMode): void;
  delayMs: number;
  onRequest?: (index: number) => Promise<void> | void;
  /** Answers a parsed `/v1/chat/completions` body: the status and the JSON body to send. */
  answer(body: ChatRequest, opts?: AnswerOptions): Promise<JsonReply>;
}

/** The "model" behind the fake servers: scripted answers, with the token fields vLLM returns when asked. */
export function createChatResponder(initial: FakeMode = { kind: 'scripted' }): ChatResponder {
  let mode = initial;
  const r: ChatResponder = {
    requests: [],
    setMode: (m) => (mode = m),
    delayMs: 0,
    async answer(body, opts = {}) {
      const { hasImage, goal, tree, previous } = promptOf(body);
      const index = r.requests.length;
      const sampling = effectiveSampling(body, opts.defaults);
      r.requests.push(record(body, hasImage, goal, sampling));
      await r.onRequest?.(index);
      if (r.delayMs > 0) await new Promise((res) => setTimeout(res, r.delayMs));
      if (mode.kind === 'status') return { status: mode.status, body: { error: { message: `fake server says ${mode.status}`, type: 'Error' } } };
      const n = Math.max(1, Number(body.n ?? 1));
      const vocab = opts.vocab ?? DEFAULT_VOCAB;
      const json = body.structured_outputs?.json;
      const schema = json == null ? undefined : jsonSchemaOf(json);
      const choices = await Promise.all(
        Array.from({ length: n }, async (_, i) => {
          const free =
            mode.kind === 'garbage'
              ? `As an AI I would rather describe the page. ${'lorem ipsum '.repeat(5 + i)}`
              : mode.kind === 'custom'
                ? mode.answer({ goal, tree: parseTree(tree), previous, choice: i, temperature: Number(body.temperature ?? 1), random: choiceDraw(body.seed, i) })
                : scriptedAnswer(goal, tree, previous, mode.kind === 'scripted' ? mode.email : undefined);
          const content = !schema ? free : opts.constrain ? await opts.constrain(schema, free) : constrainedAnswer(schema, free, opts.separators);
          return {
            index: i,
            finish_reason: 'stop',
            message: { role: 'assistant', content },
            ...vllmTokenFields(content, 'stop', body, opts.legacyTokens, {
              sampling: opts.rawLogprobs ? undefined : sampling,
              logprobPlaceholders: opts.logprobPlaceholders,
              vocab,
            }),
          };
        }),
      );
      const asked = body.return_token_ids === true && !opts.legacyTokens;
      const prompt = asked ? { prompt_token_ids: opts.promptIds ? await opts.promptIds(body) : fakePromptTokenIds(body, vocab) } : {};
      return chatCompletion(`chatcmpl-fake-${index}`, body.model, choices, prompt);
    },
  };
  return r;
}

/** `answers.promptIds`: the prompt's ids as a learner's model encodes it (testing/model-prompt-ids.ts) when the run is learnt. */
export async function startFakePolicyServer(initial: FakeMode = { kind: 'scripted' }, answers: Pick<AnswerOptions, 'promptIds'> = {}): Promise<FakePolicyServer> {
  const chat = createChatResponder(initial);
  const server = await startChatServer('fake', (body) => chat.answer(body, answers));
  return {
    url: server.url,
    requests: chat.requests,
    setMode: (m) => chat.setMode(m),
    get delayMs() {
      return chat.delayMs;
    },
    set delayMs(ms: number) {
      chat.delayMs = ms;
    },
    get onRequest() {
      return chat.onRequest;
    },
    set onRequest(f) {
      chat.onRequest = f;
    },
    close: server.close,
  };
}
