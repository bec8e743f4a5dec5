import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { NEUTRAL_SAMPLING, vllmLike } from '../activities/policy-client';
import { firstLine } from '../env/page-actions';
import type { HaloConfig } from '../lib/config/config';
import { isLoopbackHost, resolveCredential } from '../lib/serving/credentials';
import { policyReplicas } from '../lib/serving/policy-pool';
import type { DoctorCheck } from './doctor-check';
import { vllmGrammarWhitespaceCheck } from './doctor-grammar-whitespace';
import { vllmLogprobsModeCheck } from './doctor-logprobs-mode';

// `halo doctor` on the policy server: vLLM serves the model, takes images, loads LoRA adapters at run time, and (when it
// runs on this machine) was started with the adapters' rank; its log-prob mode is probed over HTTP.

/**
 * vLLM: served models, images, constrained whitespace, log-prob mode, runtime LoRA updating, and (for a vLLM on this
 * machine) its LoRA rank. A pool (policy.baseUrls) gets every check once per replica (ids `<check>#<i>`, from 1), each
 * replica its own adapter endpoint and flags, and one more row comparing the adapters the replicas serve.
 */
export async function vllmChecks(cfg: HaloConfig, env: NodeJS.ProcessEnv, timeoutMs: number): Promise<DoctorCheck[]> {
  if (cfg.policy.backend !== 'openai') {
    return [{ id: 'vllm', name: 'vLLM', status: 'skip', detail: `policy.backend is ${cfg.policy.backend}: no policy server needed` }];
  }
  const urls = policyReplicas(cfg.policy);
  if (urls.length <= 1) return serverChecks(cfg, env, timeoutMs);
  const out: DoctorCheck[] = [];
  const served: { url: string; adapters?: string[] }[] = [];
  for (const [i, url] of urls.entries()) {
    const own = (u: string | undefined) => (u === undefined ? undefined : url);
    const one: HaloConfig = {
      ...cfg,
      policy: { ...cfg.policy, baseUrl: url, baseUrls: undefined },
      train: { ...cfg.train, vllmBaseUrl: own(cfg.train.vllmBaseUrl) },
      mcts: { ...cfg.mcts, vllmBaseUrl: own(cfg.mcts.vllmBaseUrl) },
    };
    const checks = await serverChecks(one, env, timeoutMs);
    out.push(...checks.map((c) => ({ ...c, id: `${c.id}#${i + 1}`, name: `${c.name} (replica ${i + 1}, ${url})` })));
    const answered = checks.some((c) => c.id === 'vllm' && c.name === 'vLLM reachable' && c.detail.includes(' serves '));
    served.push({ url, ...(answered ? { adapters: await servedModels(url, env, cfg, timeoutMs).catch(() => undefined) } : {}) });
  }
  out.push(replicaAdaptersCheck(cfg.policy.model, served));
  return out;
}

/** The models a replica serves now (`GET /v1/models`), its key sent as for the other checks. */
async function servedModels(url: string, env: NodeJS.ProcessEnv, cfg: HaloConfig, timeoutMs: number): Promise<string[]> {
  const base = url.replace(/\/+$/, '');
  const cred = resolveCredential({ credential: cfg.policy.credential, apiKeyEnv: cfg.policy.apiKeyEnv, url: base, field: 'policy', fallback: 'policy' }, env);
  const u = new URL(base);
  const key = cred.ok && cred.key && (u.protocol === 'https:' || isLoopbackHost(u.hostname)) ? cred.key : undefined;
  const res = await fetch(`${base}/models`, { headers: key ? { authorization: `Bearer ${key}` } : {}, signal: AbortSignal.timeout(timeoutMs) });
  if (!res.ok) throw new Error(`HTTP ${res.status}`);
  return (((await res.json()) as { data?: { id: string }[] }).data ?? []).map((m) => m.id);
}

/**
 * Whether the replicas serve the same adapters: a replica that restarted serves none until a request names one (it
 * loads the adapter then), so a difference is a warning; a replica that does not answer fails the row.
 */
export function replicaAdaptersCheck(baseModel: string, served: { url: string; adapters?: string[] }[]): DoctorCheck {
  const name = 'vLLM replicas: adapters';
  const down = served.filter((s) => s.adapters === undefined).map((s) => s.url);
  const lists = served.filter((s) => s.adapters !== undefined).map((s) => ({ url: s.url, adapters: (s.adapters ?? []).filter((m) => m !== baseModel) }));
  const all = [...new Set(lists.flatMap((l) => l.adapters))].sort();
  const lacking = lists.map((l) => ({ url: l.url, missing: all.filter((a) => !l.adapters.includes(a)) })).filter((l) => l.missing.length > 0);
  const up = `${lists.length} of ${served.length} replicas answer, ${all.length} adapter${all.length === 1 ? '' : 's'} served (${all.join(', ') || 'none'})`;
  if (down.length) {
    return {
      id: 'vllm.replicas',
      name,
      status: 'fail',
      detail: `${up}; not answering: ${down.join(', ')} (sampling drains it: the others take its requests)`,
      fix: './launch.sh gpu starts every replica (or docker compose up -d --scale vllm=N)',
    };
  }
  if (lacking.length) {
    return {
      id: 'vllm.replicas',
      name,
      status: 'warn',
      detail: `${up}; ${lacking.map((l) => `${l.url} lacks ${l.missing.join(', ')}`).join('; ')}`,
      fix: 'nothing to do for a run that is sampling: a replica loads an adapter before its first request naming it (a restarted one has none)',
    };
  }
  return { id: 'vllm.replicas', name, status: 'pass', detail: up };
}

/** The checks of one server. */
async function serverChecks(cfg: HaloConfig, env: NodeJS.ProcessEnv, timeoutMs: number): Promise<DoctorCheck[]> {
  const base = cfg.policy.baseUrl.replace(/\/+$/, '');
  const root = (cfg.train.vllmBaseUrl ?? base).replace(/\/+$/, '').replace(/\/v1$/, '');
  // The key as the workers find it: the credential's variable on this side (a legacy policy.apiKeyEnv only when it
  // names that very variable), sent only to an origin allowed for it, and never over plain http off this machine.
  const cred = resolveCredential({ credential: cfg.policy.credential, apiKeyEnv: cfg.policy.apiKeyEnv, url: base, field: 'policy', fallback: 'policy' }, env);
  if (!cred.ok) {
    return [
      {
        id: 'vllm',
        name: 'vLLM credential',
        status: 'fail',
        detail: cred.message,
        fix: 'nothing was sent: fix policy.credential / policy.baseUrl or the allowed origins as the message says',
      },
    ];
  }
  const keyVar = cred.envVar;
  const keyFor = (url: string): string | undefined => {
    if (!cred.key) return undefined;
    const u = new URL(url);
    return cred.key && (u.protocol === 'https:' || isLoopbackHost(u.hostname)) ? cred.key : undefined;
  };
  const key = keyFor(base);
  const withheld = cred.key !== undefined && key === undefined;
  const headers: Record<string, string> = { 'content-type': 'application/json', ...(key ? { authorization: `Bearer ${key}` } : {}) };
  const out: DoctorCheck[] = [];
  let models: string[];
  try {
    const res = await fetch(`${base}/models`, { headers, signal: AbortSignal.timeout(timeoutMs) });
    if (res.status === 401) {
      return [
        withheld
          ? {
              id: 'vllm',
              name: 'vLLM reachable',
              status: 'fail',
              detail: `${base} wants a key (HTTP 401); doctor does not send ${keyVar} over plain http to a host that is not loopback`,
              fix: `serve it over https, or run halo doctor on that host (loopback)`,
            }
          : { id: 'vllm', name: 'vLLM reachable', status: 'fail', detail: `${base} refuses the key (HTTP 401)`, fix: `set ${keyVar} to the server's --api-key` },
      ];
    }
    if (!res.ok) throw new Error(`HTTP ${res.status} from ${base}/models`);
    models = (((await res.json()) as { data?: { id: string }[] }).data ?? []).map((m) => m.id);
  } catch (err) {
    return [
      {
        id: 'vllm',
        name: 'vLLM reachable',
        status: 'fail',
        detail: `${base}: ${firstLine((err as Error).message)}`,
        fix: './launch.sh gpu starts vLLM with the flags training needs (or docker compose up -d vllm)',
      },
    ];
  }
  const hasModel = models.includes(cfg.policy.model);
  out.push({
    id: 'vllm',
    name: 'vLLM reachable',
    status: hasModel ? 'pass' : 'fail',
    detail: `${base} serves ${models.join(', ') || 'nothing'}`,
    ...(hasModel ? {} : { fix: `serve ${cfg.policy.model} (vllm serve ${cfg.policy.model} …) or set policy.model to a served one` }),
  });
  out.push(
    hasModel
      ? await vllmImageCheck(base, cfg.policy.model, headers, timeoutMs)
      : { id: 'vllm.image', name: 'vLLM image input', status: 'skip', detail: `${cfg.policy.model} is not served` },
  );
  if (hasModel) out.push(await vllmGrammarWhitespaceCheck(cfg, base, headers, timeoutMs));
  if (hasModel && vllmLike(base)) out.push(await vllmLogprobsModeCheck(cfg, base, headers, timeoutMs));
  out.push(vllmSamplingCheck(base, cfg.policy.model));
  if (cfg.train.vllmBaseUrl === undefined && cfg.mcts.vllmBaseUrl === undefined) return out;
  // The adapter endpoint may be another server (train.vllmBaseUrl): its origin is checked for the key on its own.
  const rootCred = resolveCredential({ credential: cfg.policy.credential, apiKeyEnv: cfg.policy.apiKeyEnv, url: root, field: 'train.vllmBaseUrl', fallback: 'policy' }, env);
  if (!rootCred.ok) {
    out.push({
      id: 'vllm.lora-runtime',
      name: 'vLLM runtime LoRA updating',
      status: 'fail',
      detail: rootCred.message,
      fix: 'nothing was sent: allow the origin as the message says, or point train.vllmBaseUrl at the policy server',
    });
    out.push(vllmFlagsCheck(root, env));
    return out;
  }
  const rootKey = keyFor(root);
  const rootHeaders: Record<string, string> = { 'content-type': 'application/json', ...(rootKey ? { authorization: `Bearer ${rootKey}` } : {}) };
  // An empty body: a validation error (400/422) when the route exists, FastAPI's 404 {"detail":"Not Found"} when not.
  try {
    const res = await fetch(`${root}/v1/load_lora_adapter`, { method: 'POST', headers: rootHeaders, body: '{}', signal: AbortSignal.timeout(timeoutMs) });
    const text = await res.text();
    const missing = res.status === 404 && /"detail"\s*:\s*"Not Found"/.test(text);
    out.push(
      missing
        ? {
            id: 'vllm.lora-runtime',
            name: 'vLLM runtime LoRA updating',
            status: 'fail',
            detail: `${root}/v1/load_lora_adapter does not exist: new adapters cannot be loaded`,
            fix: 'start vLLM with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora (./launch.sh gpu does)',
          }
        : { id: 'vllm.lora-runtime', name: 'vLLM runtime LoRA updating', status: 'pass', detail: `load_lora_adapter answers (HTTP ${res.status})` },
    );
  } catch (err) {
    out.push({ id: 'vllm.lora-runtime', name: 'vLLM runtime LoRA updating', status: 'fail', detail: firstLine((err as Error).message), fix: `check ${root}` });
  }
  out.push(vllmFlagsCheck(root, env));
  return out;
}

/** A 32×32 white PNG (95 bytes): one 32-pixel block of Qwen3-VL's vision encoder (16-pixel patches merged 2×2). */
export const PROBE_PNG_DATA_URL =
  'data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAACAAAAAgCAIAAAD8GO2jAAAAJklEQVR42u3NMQ0AAAwDoPo33arYsQQMkB6LQCAQCAQCgUAg+BIMi1X0ptsIcT0AAAAASUVORK5CYII=';

/**
 * The multimodal path the policy uses: one chat completion with a tiny PNG as a data URL, max_tokens 1. A text-only
 * model, `--limit-mm-per-prompt image=0` or a broken image processor fails here, with the server's own message.
 */
async function vllmImageCheck(base: string, model: string, headers: Record<string, string>, timeoutMs: number): Promise<DoctorCheck> {
  const name = 'vLLM image input';
  const body = {
    model,
    messages: [
      {
        role: 'user',
        content: [
          { type: 'image_url', image_url: { url: PROBE_PNG_DATA_URL } },
          { type: 'text', text: 'Describe the image in one word.' },
        ],
      },
    ],
    max_tokens: 1,
    temperature: 0,
  };
  try {
    const res = await fetch(`${base}/chat/completions`, { method: 'POST', headers, body: JSON.stringify(body), signal: AbortSignal.timeout(timeoutMs) });
    const text = await res.text();
    let json: { error?: { message?: unknown } | string; detail?: unknown; message?: unknown; choices?: unknown[] } | undefined;
    try {
      json = JSON.parse(text);
    } catch {
      json = undefined;
    }
    if (res.ok && Array.isArray(json?.choices) && json.choices.length > 0) {
      return { id: 'vllm.image', name, status: 'pass', detail: `${model} answered a chat completion with a 32×32 PNG (HTTP ${res.status})` };
    }
    const err = json?.error;
    const message = typeof err === 'object' && err !== null ? err.message : (err ?? json?.message ?? json?.detail);
    const said = firstLine(typeof message === 'string' ? message : message !== undefined ? JSON.stringify(message) : text.slice(0, 300) || '(empty body)');
    return {
      id: 'vllm.image',
      name,
      status: 'fail',
      detail: `HTTP ${res.status} from ${base}/chat/completions with an image: ${said}`,
      fix: `serve ${model} as a vision-language model that takes images: no --limit-mm-per-prompt image=0 and its image processor installed (./launch.sh gpu starts vLLM that way)`,
    };
  } catch (err) {
    return { id: 'vllm.image', name, status: 'fail', detail: `${base}/chat/completions with an image: ${firstLine((err as Error).message)}`, fix: `check ${base}` };
  }
}

/** The generation_config.json fields vLLM applies to a request that leaves them out (`ModelConfig.get_diff_sampling_param`). */
const GENERATION_DEFAULTS = ['temperature', 'top_p', 'top_k', 'min_p', 'repetition_penalty'] as const;

/**
 * Whether vLLM could sample from a distribution the learner does not compute: it fills sampling fields a request
 * leaves out from the model's generation_config.json (Qwen3-VL: top_k 20, top_p 0.8) unless started with
 * `--generation-config vllm`, and says nothing of that over HTTP. What can be checked: that our requests state every
 * such field (they do for a vLLM-like server, NEUTRAL_SAMPLING), and, for a model that is a local folder, what its
 * generation_config.json would otherwise impose.
 */
export function vllmSamplingCheck(base: string, model: string, vllmArgs: string[] | undefined = findVllmArgs(new URL(base).port || '8000')): DoctorCheck {
  const name = 'vLLM sampling distribution';
  if (!vllmLike(base)) {
    return { id: 'vllm.sampling', name, status: 'skip', detail: `${base} is OpenAI's API: requests send only temperature and the token budget` };
  }
  const pins = Object.entries(NEUTRAL_SAMPLING)
    .map(([k, v]) => `${k} ${v}`)
    .join(', ');
  const stated = `every request states ${pins} and the temperature`;
  const off = vllmArgs?.some((a, i) => a === '--generation-config=vllm' || (a === '--generation-config' && vllmArgs[i + 1] === 'vllm'));
  if (off) return { id: 'vllm.sampling', name, status: 'pass', detail: `${stated}; vLLM runs with --generation-config vllm (no model defaults)` };
  const file = join(model, 'generation_config.json');
  if (!existsSync(file)) {
    return {
      id: 'vllm.sampling',
      name,
      status: 'pass',
      detail: `${stated}, over whatever defaults the server applies (it does not report them; ${model} is not a local folder to read)`,
    };
  }
  let cfg: Record<string, unknown>;
  try {
    cfg = JSON.parse(readFileSync(file, 'utf8')) as Record<string, unknown>;
  } catch (err) {
    return { id: 'vllm.sampling', name, status: 'warn', detail: `${file}: ${firstLine((err as Error).message)}`, fix: 'vLLM reads this file for its sampling defaults: fix it' };
  }
  const num = (k: string) => (typeof cfg[k] === 'number' ? (cfg[k] as number) : undefined);
  const cuts = [(num('top_k') ?? 0) >= 1, (num('top_p') ?? 1) < 1, (num('min_p') ?? 0) > 0].some(Boolean);
  const imposed = GENERATION_DEFAULTS.filter((k) => num(k) !== undefined)
    .map((k) => `${k} ${num(k)}`)
    .join(', ');
  if (!cuts) return { id: 'vllm.sampling', name, status: 'pass', detail: `${stated}; ${file} cuts nothing (${imposed || 'no sampling field'})` };
  return {
    id: 'vllm.sampling',
    name,
    status: 'warn',
    detail: `${file} sets ${imposed}: vLLM samples a request that leaves these out from the cut distribution. ${stated}, so this version's workers are not affected`,
    fix: 'start vLLM with --generation-config vllm, so a request without them (an older worker, another client) is not cut either',
  };
}

/** The adapters' rank: HALO_LORA_RANK as the learner reads it (default 16). */
export function adapterRank(env: NodeJS.ProcessEnv = process.env): number {
  return Number(env.HALO_LORA_RANK) || 16;
}

/** `--max-lora-rank` and `--logprobs-mode` of a vLLM process on this machine (a remote one cannot be asked). */
function vllmFlagsCheck(root: string, env: NodeJS.ProcessEnv): DoctorCheck {
  const name = 'vLLM LoRA rank';
  const rank = adapterRank(env);
  const port = new URL(root).port || '8000';
  const args = findVllmArgs(port);
  if (!args) {
    return {
      id: 'vllm.lora-rank',
      name,
      status: 'skip',
      detail: `no vLLM process on this machine to read --max-lora-rank from (adapters have rank ${rank})`,
      fix: `make sure it runs with --max-lora-rank ≥ ${rank}`,
    };
  }
  const flag = (n: string) => {
    const i = args.findIndex((a) => a === n || a.startsWith(`${n}=`));
    if (i < 0) return undefined;
    return args[i].includes('=') ? args[i].split('=')[1] : args[i + 1];
  };
  const maxRank = Number(flag('--max-lora-rank') ?? 16); // vLLM's default
  const lora = args.includes('--enable-lora');
  const mode = flag('--logprobs-mode') ?? 'raw_logprobs';
  const problems: string[] = [];
  if (!lora) problems.push('--enable-lora is not set');
  if (maxRank < rank) problems.push(`--max-lora-rank ${maxRank} < adapter rank ${rank} (HALO_LORA_RANK)`);
  const detail = `--max-lora-rank ${maxRank}, adapters rank ${rank}, --logprobs-mode ${mode}`;
  if (problems.length)
    return {
      id: 'vllm.lora-rank',
      name,
      status: 'fail',
      detail: problems.join('; '),
      fix: `restart vLLM with --enable-lora --max-lora-rank ${Math.max(rank, 64)} (./launch.sh gpu)`,
    };
  if (mode !== 'processed_logprobs') {
    return { id: 'vllm.lora-rank', name, status: 'warn', detail, fix: 'start vLLM with --logprobs-mode processed_logprobs so the sampler log-probs are after temperature' };
  }
  return { id: 'vllm.lora-rank', name, status: 'pass', detail };
}

function findVllmArgs(port: string): string[] | undefined {
  let pids: string[];
  try {
    pids = readdirSync('/proc').filter((p) => /^\d+$/.test(p));
  } catch {
    return undefined;
  }
  for (const pid of pids) {
    let args: string[];
    try {
      args = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean);
    } catch {
      continue;
    }
    const i = args.findIndex((a) => /(^|\/)vllm$/.test(a) || a === 'vllm.entrypoints.openai.api_server');
    if (i < 0 || (!args.includes('serve') && !args.some((a) => a.includes('api_server')))) continue;
    const pi = args.indexOf('--port');
    if ((pi >= 0 ? args[pi + 1] : '8000') !== port) continue;
    return args;
  }
  return undefined;
}
