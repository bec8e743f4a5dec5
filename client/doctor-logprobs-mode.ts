import { NEUTRAL_SAMPLING, UNKNOWN_LOGPROB } from '../activities/policy-client';
import { firstLine } from '../env/page-actions';
import type { HaloConfig } from '../lib/config/config';
import type { DoctorCheck } from './doctor-check';

// `halo doctor`: are vLLM's log-probs taken after temperature (`--logprobs-mode processed_logprobs`) or before it
// (`raw_logprobs`, vLLM's default)? The server does not say over HTTP, and a containerised or remote one has no
// command line to read, yet raw log-probs at a temperature other than 1 bias every importance ratio with nothing
// failing. What can be seen over HTTP: one prompt at two temperatures with one seed. At a position both answers
// reach with the same prefix the model's distribution is the same; processed log-probs of a token there change with
// temperature (log p/T - log Z), raw ones are the same computation twice.

const PROBE_TEMPERATURES = [1, 0.5] as const;
const PROBE_SEED = 1234;
const PROBE_MAX_TOKENS = 8;
const PROBE_TOP_LOGPROBS = 5;
/** Below it: the same numbers (raw). Run-to-run noise of one prompt's raw log-probs stays far below. */
const SAME = 0.05;
/** Above it: moved by the temperature (processed). At T = 0.5 a token of probability 0.9 already moves by ~0.1. */
const MOVED = 0.08;

type Entry = { token?: unknown; logprob?: unknown; top_logprobs?: { token?: unknown; logprob?: unknown }[] };

/** Per position, token → log-prob from the sampled entry and its alternatives (vLLM's -9999 placeholders left out). */
function positions(json: unknown): Map<string, number>[] | undefined {
  const content = (json as { choices?: { logprobs?: { content?: Entry[] } }[] } | undefined)?.choices?.[0]?.logprobs?.content;
  if (!Array.isArray(content)) return undefined;
  return content.map((e) => {
    const m = new Map<string, number>();
    for (const x of [e, ...(Array.isArray(e.top_logprobs) ? e.top_logprobs : [])]) {
      if (typeof x.token === 'string' && typeof x.logprob === 'number' && x.logprob > UNKNOWN_LOGPROB) m.set(x.token, x.logprob);
    }
    return m;
  });
}

/** The sampled token of each position (the first entry's). */
const sampledTokens = (json: unknown): unknown[] => ((json as { choices?: { logprobs?: { content?: Entry[] } }[] }).choices?.[0]?.logprobs?.content ?? []).map((e) => e.token);

/**
 * The largest change of one token's log-prob between the two answers, over the positions both reach with the same
 * prefix (the first always), and how many log-probs were compared.
 */
export function logprobShift(a: unknown, b: unknown): { shift: number; compared: number } | undefined {
  const pa = positions(a);
  const pb = positions(b);
  if (!pa || !pb) return undefined;
  const ta = sampledTokens(a);
  const tb = sampledTokens(b);
  let shift = 0;
  let compared = 0;
  for (let t = 0; t < Math.min(pa.length, pb.length); t++) {
    for (const [token, lp] of pa[t]) {
      const other = pb[t].get(token);
      if (other === undefined) continue;
      shift = Math.max(shift, Math.abs(lp - other));
      compared++;
    }
    if (ta[t] !== tb[t]) break; // later positions follow different prefixes
  }
  return { shift, compared };
}

/** Probes the policy server (`base`, its /v1 URL) for its log-prob mode. */
export async function vllmLogprobsModeCheck(cfg: HaloConfig, base: string, headers: Record<string, string>, timeoutMs: number): Promise<DoctorCheck> {
  const id = 'vllm.logprobs-mode';
  const name = 'vLLM log-prob mode';
  const fixFlag = 'start vLLM with --logprobs-mode processed_logprobs (./launch.sh gpu and docker compose do)';
  const unknown = (why: string): DoctorCheck => ({ id, name, status: 'warn', detail: `unknown: ${why}`, fix: `make sure vLLM runs with --logprobs-mode processed_logprobs` });
  const answers: unknown[] = [];
  try {
    for (const temperature of PROBE_TEMPERATURES) {
      const res = await fetch(`${base}/chat/completions`, {
        method: 'POST',
        headers,
        body: JSON.stringify({
          model: cfg.policy.model,
          messages: [{ role: 'user', content: 'Name a colour.' }],
          max_tokens: PROBE_MAX_TOKENS,
          temperature,
          seed: PROBE_SEED,
          logprobs: true,
          top_logprobs: PROBE_TOP_LOGPROBS,
          return_tokens_as_token_ids: true,
          ...NEUTRAL_SAMPLING,
        }),
        signal: AbortSignal.timeout(timeoutMs),
      });
      const text = await res.text();
      let json: unknown;
      try {
        json = JSON.parse(text);
      } catch {
        json = undefined;
      }
      if (res.status !== 200 || json === undefined)
        return unknown(`the probe at temperature ${temperature} answered HTTP ${res.status}: ${firstLine(text.slice(0, 300) || '(empty body)')}`);
      answers.push(json);
    }
  } catch (err) {
    return unknown(firstLine((err as Error).message));
  }
  const seen = logprobShift(answers[0], answers[1]);
  if (!seen) return unknown('the answers carry no logprobs.content');
  if (seen.compared === 0) return unknown('the two answers share no token with a log-prob to compare');
  const [t1, t2] = PROBE_TEMPERATURES;
  const said = `one prompt at temperatures ${t1} and ${t2} (seed ${PROBE_SEED}): ${seen.compared} log-probs compared, largest change ${seen.shift.toFixed(4)}`;
  if (seen.shift > MOVED) return { id, name, status: 'pass', detail: `${said}: processed (after temperature), as the learner computes them` };
  if (seen.shift >= SAME) return unknown(`${said}: too small to call processed, too large to call raw`);
  const t = cfg.policy.temperature;
  if (t === 1) {
    return {
      id,
      name,
      status: 'warn',
      detail: `${said}: raw (before temperature, vLLM's default); equal to processed at policy.temperature 1 with no cuts`,
      fix: `${fixFlag}, so another temperature stays correct`,
    };
  }
  return {
    id,
    name,
    status: 'fail',
    detail: `${said}: raw (before temperature, vLLM's default --logprobs-mode raw_logprobs), while policy.temperature is ${t}: every importance ratio would compare the learner's tempered log-probs with untempered ones`,
    fix: fixFlag,
  };
}
