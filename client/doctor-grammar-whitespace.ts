import { firstLine } from '../env/page-actions';
import { vllmStructuredOutputsConfig, type GrammarWhitespace } from '../lib/action-grammar';
import type { HaloConfig } from '../lib/config';
import type { DoctorCheck } from './doctor-check';

// `halo doctor`: does vLLM allow the free whitespace in constrained JSON that the learner's grammar allows? The
// server decides it at start (--structured-outputs-config disable_any_whitespace; the request's own flag is
// ignored), and a disagreement fails every update of a constrained run (GrammarMismatch) or, the other way round,
// recomputes log-probs under a wider mask than the one sampled from.

/** Small and without free text: any whitespace in the answer outside `", "`/`": "` is the grammar's, not a string's. */
const PROBE_SCHEMA = {
  type: 'object',
  properties: { a: { type: 'integer', minimum: 0, maximum: 9 }, b: { enum: [1, 2] } },
  required: ['a', 'b'],
  additionalProperties: false,
};
const PROBE_MAX_TOKENS = 24;

/**
 * Whether a constrained answer holds whitespace that compact xgrammar JSON cannot: outside strings, other than the
 * `", "` and `": "` separators, in the JSON value that starts at the first `{` (to its end, or the text's end when
 * the answer was cut off). Text around the JSON is not the grammar's (a server that wraps it, such as the fake's tags).
 */
export function hasFreeWhitespace(text: string): boolean {
  const start = text.indexOf('{');
  if (start < 0) return false;
  let outside = '';
  let depth = 0;
  let inString = false;
  let escaped = false;
  for (const ch of text.slice(start)) {
    if (inString) {
      if (escaped) escaped = false;
      else if (ch === '\\') escaped = true;
      else if (ch === '"') inString = false;
      continue;
    }
    outside += ch;
    if (ch === '"') inString = true;
    else if (ch === '{' || ch === '[') depth++;
    else if (ch === '}' || ch === ']') {
      depth--;
      if (depth === 0) break;
    }
  }
  return /[ \t\n\r]/.test(outside.replaceAll(', ', ',').replaceAll(': ', ':'));
}

async function postJson(url: string, headers: Record<string, string>, body: unknown, timeoutMs: number): Promise<{ status: number; json: unknown; text: string }> {
  const res = await fetch(url, { method: 'POST', headers, body: JSON.stringify(body), signal: AbortSignal.timeout(timeoutMs) });
  const text = await res.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, json, text };
}

/**
 * Probes the policy server (`base`, its /v1 URL) with a constrained request that makes whitespace likely: the ids
 * of whitespace tokens from vLLM's `POST /tokenize` get `logit_bias` +100 under a small schema, greedy. A server
 * that allows free whitespace then writes it right after `{`; a compact one cannot. Unknown (a warning) when the
 * server has no /tokenize or refuses the probe.
 */
export async function vllmGrammarWhitespaceCheck(cfg: HaloConfig, base: string, headers: Record<string, string>, timeoutMs: number): Promise<DoctorCheck> {
  const id = 'vllm.grammar-whitespace';
  const name = 'vLLM constrained whitespace';
  const want: GrammarWhitespace = cfg.policy.grammarWhitespace;
  if (!cfg.policy.constrained) return { id, name, status: 'skip', detail: 'policy.constrained is off: no grammar to agree on' };
  const root = base.replace(/\/v1$/, '');
  const model = cfg.policy.model;
  const flag = (w: GrammarWhitespace) => `--structured-outputs-config '${vllmStructuredOutputsConfig(w)}'`;
  const unknown = (why: string): DoctorCheck => ({
    id,
    name,
    status: 'warn',
    detail: `unknown: ${why}`,
    fix: `make sure vLLM runs with ${flag(want)} (policy.grammarWhitespace ${want})`,
  });
  let allowsAny: boolean;
  let sample: string;
  try {
    const ids = new Set<number>();
    for (const prompt of [' ', '\n']) {
      const tok = await postJson(`${root}/tokenize`, headers, { model, prompt, add_special_tokens: false }, timeoutMs);
      if (tok.status === 404 && /"detail"\s*:\s*"Not Found"/.test(tok.text)) return unknown(`${root}/tokenize does not exist, so no whitespace token can be favoured`);
      const tokens = (tok.json as { tokens?: unknown } | undefined)?.tokens;
      if (tok.status !== 200 || !Array.isArray(tokens)) return unknown(`${root}/tokenize answered HTTP ${tok.status}: ${firstLine(tok.text.slice(0, 300) || '(empty body)')}`);
      for (const t of tokens) if (Number.isInteger(t) && t >= 0) ids.add(t);
    }
    if (ids.size === 0) return unknown('/tokenize gave no token for whitespace');
    const chat = await postJson(
      `${base}/chat/completions`,
      headers,
      {
        model,
        messages: [{ role: 'user', content: 'Answer with a JSON object.' }],
        max_tokens: PROBE_MAX_TOKENS,
        temperature: 0,
        logit_bias: Object.fromEntries([...ids].map((t) => [String(t), 100])),
        structured_outputs: { json: PROBE_SCHEMA },
      },
      timeoutMs,
    );
    const content = (chat.json as { choices?: { message?: { content?: unknown } }[] } | undefined)?.choices?.[0]?.message?.content;
    if (chat.status !== 200 || typeof content !== 'string')
      return unknown(`the constrained probe answered HTTP ${chat.status}: ${firstLine(chat.text.slice(0, 300) || '(empty body)')}`);
    allowsAny = hasFreeWhitespace(content);
    sample = JSON.stringify(content.length > 40 ? `${content.slice(0, 40)}…` : content);
  } catch (err) {
    return unknown(firstLine((err as Error).message));
  }
  const server: GrammarWhitespace = allowsAny ? 'any' : 'compact';
  const said = `with whitespace tokens favoured, ${model} answered ${sample}: the server allows ${allowsAny ? 'free whitespace' : 'no free whitespace'} (${server}), policy.grammarWhitespace is ${want}`;
  if (server !== want) {
    return {
      id,
      name,
      status: 'fail',
      detail: `${said}; the learner's grammar mask would ${want === 'compact' ? 'refuse its samples (GrammarMismatch, the run fails)' : 'be wider than the one sampled from (biased log-probs)'}`,
      fix:
        want === 'compact'
          ? `restart vLLM with ${flag('compact')} (./launch.sh gpu and docker compose do), or set policy.grammarWhitespace: any`
          : `set policy.grammarWhitespace: compact, or restart vLLM without ${flag('compact')}`,
    };
  }
  if (server === 'any') {
    return {
      id,
      name,
      status: 'warn',
      detail: `${said}; whitespace has no bound, so a sample may run out of policy.maxTokens (an invalid action)`,
      fix: `start vLLM with ${flag('compact')} and set policy.grammarWhitespace: compact`,
    };
  }
  return { id, name, status: 'pass', detail: said };
}
