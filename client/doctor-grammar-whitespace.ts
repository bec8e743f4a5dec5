import { firstLine } from '../env/page-actions';
import { vllmStructuredOutputsConfig, type GrammarWhitespace } from '../lib/model-io/action-grammar';
import type { HaloConfig } from '../lib/config/config';
import { VLLM_GRAMMAR_CALLS, VLLM_SERVERS, type VllmServer } from '../lib/model-io/grammar-blob';
import type { DoctorCheck } from './doctor-check';

// `halo doctor`: does vLLM allow the free whitespace in constrained JSON that the learner's grammar allows? The
// server decides it at start (--structured-outputs-config disable_any_whitespace; the request's own flag is
// ignored), and a disagreement fails every update of a constrained run (GrammarMismatch) or, the other way round,
// recomputes log-probs under a wider mask than the one sampled from. Compact, the release decides the separators
// (0.33: `{"a":1}`, 0.31: `{"a": 1}`), which policy.server must name: the answer is read as written, never folded.

/** Small and without free text: any whitespace in the answer outside `", "`/`": "` is the grammar's, not a string's. */
const PROBE_SCHEMA = {
  type: 'object',
  properties: { a: { type: 'integer', minimum: 0, maximum: 9 }, b: { enum: [1, 2] } },
  required: ['a', 'b'],
  additionalProperties: false,
};
const PROBE_MAX_TOKENS = 24;

/** The JSON value that starts at the first `{` (to its end, or the text's end when cut off), strings emptied. */
function structureOf(text: string): string {
  const start = text.indexOf('{');
  if (start < 0) return '';
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
  return outside;
}

/**
 * How a constrained answer was written: `any` (whitespace no compact call writes: outside strings, other than one
 * space after `,` or `:`), `spaced` (xgrammar's default `", "`/`": "`, vLLM 0.31's call), `tight` (`,`/`:`, vLLM
 * 0.33's), `mixed` (both), or `none` (no separator to tell). Text around the JSON is not the grammar's.
 */
export function separatorStyle(text: string): 'any' | 'spaced' | 'tight' | 'mixed' | 'none' {
  const outside = structureOf(text);
  if (/[ \t\n\r]/.test(outside.replaceAll(', ', ',').replaceAll(': ', ':'))) return 'any';
  const spaced = /[,:] /.test(outside);
  const tight = /[,:][^ ]/.test(outside);
  return spaced && tight ? 'mixed' : spaced ? 'spaced' : tight ? 'tight' : 'none';
}

/** Whether a constrained answer holds whitespace that no compact xgrammar call writes. */
export function hasFreeWhitespace(text: string): boolean {
  return separatorStyle(text) === 'any';
}

/** What a compact server of `release` writes. */
const styleOf = (release: VllmServer) => (VLLM_GRAMMAR_CALLS[release].compactSeparators?.join('') === ',:' ? 'tight' : 'spaced');

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
  let style: ReturnType<typeof separatorStyle>;
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
    style = separatorStyle(content);
    allowsAny = style === 'any';
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
  const release = cfg.policy.server;
  if (style !== 'none' && style !== styleOf(release)) {
    const writes = style === 'mixed' ? 'both `,` and `, `' : style === 'tight' ? '`,`/`:` without spaces' : '`, `/`: `';
    const others = VLLM_SERVERS.filter((r) => styleOf(r) === style);
    return {
      id,
      name,
      status: 'fail',
      detail: `${said}; its separators are ${writes}, which is not the call of policy.server ${release}: the learner's grammar would refuse its samples (GrammarMismatch)`,
      fix: others.length
        ? `set policy.server: ${others[0]}, or run vLLM ${release.slice('vllm-'.length)}`
        : `run vLLM ${release.slice('vllm-'.length)} (xgrammar issue 945 writes a space after some commas)`,
    };
  }
  return { id, name, status: 'pass', detail: `${said}; separators ${style === 'none' ? 'not seen' : `${style}, as ${release} writes`}` };
}
