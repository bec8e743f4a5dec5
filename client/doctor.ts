import { Connection } from '@temporalio/client';
import { execFile } from 'node:child_process';
import { lookup } from 'node:dns/promises';
import { existsSync, readdirSync, readFileSync, statfsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { launchChromium } from '../env/browser';
import { startMiniwobServer } from '../env/miniwob-server';
import { checkSiteHealth } from '../env/real';
import { EXPECTED_AGISDK_VERSION, findAgisdk, listRealTasks } from '../env/real-tasks';
import { connectOptions, temporalSettings } from '../host/connection';
import type { HaloConfig } from '../lib/config';
import { isLoopbackHost, resolveCredential } from '../lib/credentials';
import { learnerBaseModel } from '../lib/run-context';
import { ALL_SEARCH_ATTRIBUTES } from '../lib/search-attributes';
import { haloHome } from '../host/home';
import { isAlive, pidFile, REPO_ROOT } from './processes';
import { learnerSettings, stackStatus } from './stack';

// `halo doctor`: is this machine ready to train? One row per check, each with what to do when it fails.

export type CheckStatus = 'pass' | 'warn' | 'fail' | 'skip';

export interface DoctorCheck {
  /** Stable identifier (`temporal`, `worker.browser`, …), for scripts and tests. */
  id: string;
  name: string;
  status: CheckStatus;
  detail: string;
  /** What to do about a fail, warn or skip. */
  fix?: string;
}

export interface DoctorReport {
  ok: boolean;
  checks: DoctorCheck[];
}

/** A poller seen longer ago than this is a worker that went away (Temporal keeps pollers listed for minutes). */
const POLLER_FRESH_MS = 90_000;
const GiB = 1024 ** 3;

export interface DoctorOptions {
  env?: NodeJS.ProcessEnv;
  /** Seconds each network probe may take (default 5). */
  timeoutS?: number;
}

export async function runDoctor(cfg: HaloConfig, opts: DoctorOptions = {}): Promise<DoctorReport> {
  const env = opts.env ?? process.env;
  const timeoutMs = (opts.timeoutS ?? 5) * 1000;
  const checks: DoctorCheck[] = [];
  checks.push(...(await temporalChecks(cfg, env, timeoutMs)));
  const local = await Promise.all([chromiumCheck(), miniwobCheck(), agisdkCheck()]);
  checks.push(...local);
  checks.push(await realSitesCheck(cfg, env, timeoutMs));
  checks.push(...(await vllmChecks(cfg, env, timeoutMs)));
  checks.push(await gpuCheck());
  checks.push(diskCheck(cfg));
  checks.push(learnerWatchdogCheck(resolve(REPO_ROOT, haloHome(env, cfg.stack.home)), cfg.train.gpuTaskQueue));
  return { ok: checks.every((c) => c.status !== 'fail'), checks };
}

const HALO_UP = 'npx halo up';

async function temporalChecks(cfg: HaloConfig, env: NodeJS.ProcessEnv, timeoutMs: number): Promise<DoctorCheck[]> {
  const s = temporalSettings(cfg.temporal, env);
  const ids = ['temporal.namespace', 'temporal.search-attributes', 'worker.control', 'worker.browser', 'learner'];
  const names = ['Temporal namespace', 'search attributes', 'control worker', 'browser worker', 'learner'];
  let conn: Connection;
  try {
    conn = await Connection.connect({ ...connectOptions(s), connectTimeout: timeoutMs });
    await conn.workflowService.getSystemInfo({});
  } catch (err) {
    return [
      {
        id: 'temporal',
        name: 'Temporal server',
        status: 'fail',
        detail: `cannot reach ${s.address}: ${firstLine((err as Error).message)}`,
        fix: `${HALO_UP} starts the local dev server; for another server set TEMPORAL_ADDRESS (or temporal.address)`,
      },
      ...ids.map((id, i) => ({ id, name: names[i], status: 'skip' as const, detail: 'Temporal is unreachable' })),
    ];
  }
  const out: DoctorCheck[] = [{ id: 'temporal', name: 'Temporal server', status: 'pass', detail: `${s.address} answers` }];
  try {
    try {
      const ns = await conn.workflowService.describeNamespace({ namespace: s.namespace });
      const days = Number(ns.config?.workflowExecutionRetentionTtl?.seconds ?? 0) / 86_400;
      out.push({ id: 'temporal.namespace', name: 'Temporal namespace', status: 'pass', detail: `${s.namespace} (retention ${days} days)` });
    } catch (err) {
      out.push({
        id: 'temporal.namespace',
        name: 'Temporal namespace',
        status: 'fail',
        detail: `${s.namespace}: ${firstLine((err as Error).message)}`,
        fix: `${HALO_UP} creates it on the local server; elsewhere: temporal operator namespace create --namespace ${s.namespace}`,
      });
      return [...out, ...ids.slice(1).map((id, i) => ({ id, name: names[i + 1], status: 'skip' as const, detail: 'no namespace' }))];
    }
    const sa = await conn.operatorService.listSearchAttributes({ namespace: s.namespace });
    const have = new Set(Object.keys(sa.customAttributes ?? {}));
    const missing = ALL_SEARCH_ATTRIBUTES.map((k) => k.name).filter((n) => !have.has(n));
    out.push(
      missing.length === 0
        ? { id: 'temporal.search-attributes', name: 'search attributes', status: 'pass', detail: ALL_SEARCH_ATTRIBUTES.map((k) => k.name).join(', ') }
        : {
            id: 'temporal.search-attributes',
            name: 'search attributes',
            status: 'fail',
            detail: `missing ${missing.join(', ')}`,
            fix: `${HALO_UP} adds them on the local server; elsewhere: ${missing.map((n) => `temporal operator search-attribute create --namespace ${s.namespace} --name ${n} --type Keyword`).join(' && ')}`,
          },
    );
    const st = stackStatus(cfg);
    const learner = learnerSettings(env);
    out.push(
      await workerCheck(conn, s.namespace, {
        id: 'worker.control',
        name: 'control worker',
        queue: cfg.temporal.controlTaskQueue,
        type: 'workflow',
        pidNames: ['control-worker'],
        home: st.home,
        fix: `${HALO_UP} starts it (log: ${join(st.home, 'logs', 'control-worker.log')})`,
      }),
    );
    out.push(
      await workerCheck(conn, s.namespace, {
        id: 'worker.browser',
        name: 'browser worker',
        queue: cfg.temporal.browserTaskQueue,
        type: 'activity',
        pidNames: Array.from({ length: cfg.stack.browserWorkers }, (_, i) => `browser-worker-${i}`),
        home: st.home,
        fix: `${HALO_UP} starts it (logs: ${join(st.home, 'logs', 'browser-worker-<i>.log')})`,
      }),
    );
    const lc = await workerCheck(conn, s.namespace, {
      id: 'learner',
      name: 'learner',
      queue: cfg.train.gpuTaskQueue,
      type: 'activity',
      pidNames: ['learner'],
      home: st.home,
      fix:
        `${HALO_UP} starts it (HALO_MODEL=Qwen/Qwen3-VL-8B-Instruct for the real model; log: ${join(st.home, 'logs', 'learner.log')}); ` +
        `on a GPU box without Docker: ./launch.sh gpu${learner.enabled ? '' : '; HALO_LEARNER is off in this shell, so halo up leaves it out'}`,
    });
    out.push(learnerDetail(lc, cfg));
  } finally {
    await conn.close();
  }
  return out;
}

interface WorkerSpec {
  id: string;
  name: string;
  queue: string;
  type: 'workflow' | 'activity';
  /** Pid files of the local stack (`halo up`) for this role: a file whose process is gone is a stopped worker. */
  pidNames: string[];
  home: string;
  fix: string;
}

export interface WorkerCheck extends DoctorCheck {
  identities?: string[];
}

async function workerCheck(conn: Connection, namespace: string, w: WorkerSpec): Promise<WorkerCheck> {
  const stale = w.pidNames.filter((n) => {
    const f = pidFile(w.home, n);
    if (!existsSync(f)) return false;
    const pid = Number(readFileSync(f, 'utf8').trim());
    return !(Number.isInteger(pid) && pid > 0 && isAlive(pid));
  });
  if (stale.length) {
    return {
      id: w.id,
      name: w.name,
      status: 'fail',
      detail: `${stale.join(', ')} of the local stack is not running (its pid file in ${join(w.home, 'pids')} names a process that is gone)`,
      fix: w.fix,
    };
  }
  const res = await conn.workflowService.describeTaskQueue({
    namespace,
    taskQueue: { name: w.queue },
    taskQueueType: w.type === 'activity' ? 2 /* ACTIVITY */ : 1 /* WORKFLOW */,
  });
  const now = Date.now();
  const fresh = (res.pollers ?? []).filter((p) => {
    const t = p.lastAccessTime;
    if (!t?.seconds) return true;
    return now - (Number(t.seconds) * 1000 + Math.floor((t.nanos ?? 0) / 1e6)) < POLLER_FRESH_MS;
  });
  if (fresh.length === 0) {
    return { id: w.id, name: w.name, status: 'fail', detail: `no worker polls task queue ${w.queue}`, fix: w.fix };
  }
  const identities = fresh.map((p) => p.identity ?? '?');
  return { id: w.id, name: w.name, status: 'pass', detail: `${fresh.length} poller(s) on ${w.queue}`, identities };
}

/** The learner names its model and device in its worker identity (`… halo-learner model=X device=Y`). */
export function learnerDetail(c: WorkerCheck, cfg: HaloConfig): DoctorCheck {
  const { identities, ...check } = c;
  if (check.status !== 'pass' || !identities) return check;
  const parsed = identities.map((id) => ({
    model: /\bmodel=(\S+)/.exec(id)?.[1],
    device: /\bdevice=(\S+)/.exec(id)?.[1],
    gpu: /\bgpu=(\S+)/.exec(id)?.[1]?.replace(/_/g, ' '),
  }));
  const desc = parsed
    .map((p) => (p.model ? `${p.model} on ${p.device ?? '?'}${p.gpu ? ` (${p.gpu})` : ''}` : 'model and device not reported'))
    .join('; ');
  const detail = `${check.detail}: ${desc}`;
  const want = learnerBaseModel(cfg);
  const other = want ? parsed.find((p) => p.model && p.model !== want) : undefined;
  if (other) {
    return { ...check, status: 'fail', detail, fix: `the config trains ${want}; restart the learner with HALO_MODEL=${want}` };
  }
  const bigOnCpu = parsed.find((p) => p.device === 'cpu' && p.model && /\b\d{1,3}(\.\d+)?B\b/i.test(p.model.replace(/[-_/]/g, ' ')) && parseFloat(/(\d{1,3}(?:\.\d+)?)B\b/i.exec(p.model)![1]) >= 3);
  if (bigOnCpu) {
    return {
      ...check,
      status: 'warn',
      detail,
      fix: `${bigOnCpu.model} runs on the CPU: an update takes hours; check that torch sees the GPU (python -c "import torch; print(torch.cuda.is_available())")`,
    };
  }
  return { ...check, detail };
}

async function chromiumCheck(): Promise<DoctorCheck> {
  const name = 'Chromium launches';
  try {
    const browser = await launchChromium({ timeoutMs: 30_000 });
    try {
      const version = browser.version();
      const page = await browser.newPage();
      await page.setContent('<p>ok</p>');
      return { id: 'chromium', name, status: 'pass', detail: `Chromium ${version}` };
    } finally {
      await browser.close();
    }
  } catch (err) {
    return {
      id: 'chromium',
      name,
      status: 'fail',
      detail: firstLine((err as Error).message),
      fix: "./launch.sh setup installs Debian's chromium; elsewhere set HALO_CHROMIUM to a Chromium binary (README: Ubuntu 22.04)",
    };
  }
}

async function miniwobCheck(): Promise<DoctorCheck> {
  const name = 'MiniWoB++ pages';
  const fix = './launch.sh setup installs miniwob==1.1.0 into .venv; or set HALO_MINIWOB_HTML to its html/ folder';
  let server;
  try {
    server = await startMiniwobServer();
  } catch (err) {
    return { id: 'miniwob', name, status: 'fail', detail: firstLine((err as Error).message), fix };
  }
  try {
    const res = await fetch(`${server.baseUrl}/miniwob/click-button.html`, { signal: AbortSignal.timeout(5000) });
    const text = await res.text();
    if (res.status !== 200 || !text.includes('<')) return { id: 'miniwob', name, status: 'fail', detail: `click-button.html answered HTTP ${res.status}`, fix };
    return { id: 'miniwob', name, status: 'pass', detail: `served from ${server.root}` };
  } catch (err) {
    return { id: 'miniwob', name, status: 'fail', detail: firstLine((err as Error).message), fix };
  } finally {
    await server.close();
  }
}

async function agisdkCheck(): Promise<DoctorCheck> {
  const name = 'agisdk (REAL tasks)';
  const fix = `./launch.sh setup (pip install --no-deps agisdk==${EXPECTED_AGISDK_VERSION} into .venv)`;
  try {
    const { version, dir } = findAgisdk();
    if (version !== EXPECTED_AGISDK_VERSION) {
      return { id: 'agisdk', name, status: 'warn', detail: `agisdk ${version} at ${dir}; the project pins ${EXPECTED_AGISDK_VERSION}`, fix };
    }
    return { id: 'agisdk', name, status: 'pass', detail: `agisdk ${version}` };
  } catch (err) {
    return { id: 'agisdk', name, status: 'fail', detail: firstLine((err as Error).message), fix };
  }
}

async function realSitesCheck(cfg: HaloConfig, env: NodeJS.ProcessEnv, timeoutMs: number): Promise<DoctorCheck> {
  const name = 'REAL sites reachable';
  const needed = cfg.episode.env === 'real';
  let origins: string[];
  if (env.HALO_REAL_ORIGIN) origins = [new URL(env.HALO_REAL_ORIGIN).origin];
  else {
    try {
      origins = [...new Set(listRealTasks().map((t) => t.origin))].sort();
    } catch (err) {
      return { id: 'real', name, status: 'skip', detail: `no REAL task list: ${firstLine((err as Error).message)}`, fix: 'fix the agisdk check first' };
    }
  }
  // Offline (no DNS): said so, not failed.
  const host = new URL(origins[0]).hostname;
  if (!/^(\d+\.){3}\d+$|^localhost$|^\[/.test(host)) {
    try {
      await Promise.race([lookup(host), new Promise((_, rej) => setTimeout(() => rej(Object.assign(new Error('DNS timeout'), { code: 'ETIMEOUT' })), timeoutMs))]);
    } catch (err) {
      return {
        id: 'real',
        name,
        status: 'skip',
        detail: `offline: ${host} does not resolve (${(err as NodeJS.ErrnoException).code ?? (err as Error).message}); REAL sites were not checked`,
        fix: needed ? 'REAL training needs internet access to the sites (or HALO_REAL_ORIGIN pointing at a mirror)' : undefined,
      };
    }
  }
  const results = await Promise.all(
    origins.map((o) =>
      checkSiteHealth(o, { attempts: 1, timeoutMs }).then(
        () => null,
        (err: Error) => `${o}: ${firstLine(err.message)}`,
      ),
    ),
  );
  const bad = results.filter((r): r is string => r !== null);
  if (bad.length === 0) return { id: 'real', name, status: 'pass', detail: `${origins.length} site(s) answer` };
  return {
    id: 'real',
    name,
    status: needed ? 'fail' : 'warn',
    detail: `${bad.length} of ${origins.length} unreachable: ${bad.join('; ')}`,
    fix: `check the network (proxy, firewall)${needed ? '' : '; this config trains MiniWoB++, so REAL is not needed for it'}`,
  };
}

/** vLLM: served models, runtime LoRA updating, and (for a vLLM on this machine) its LoRA rank and log-prob mode. */
export async function vllmChecks(cfg: HaloConfig, env: NodeJS.ProcessEnv, timeoutMs: number): Promise<DoctorCheck[]> {
  if (cfg.policy.backend !== 'openai') {
    return [{ id: 'vllm', name: 'vLLM', status: 'skip', detail: `policy.backend is ${cfg.policy.backend}: no policy server needed` }];
  }
  const base = cfg.policy.baseUrl.replace(/\/+$/, '');
  const root = (cfg.train.vllmBaseUrl ?? base).replace(/\/+$/, '').replace(/\/v1$/, '');
  // The key as the workers find it: the credential's variable on this side (a legacy policy.apiKeyEnv only when it
  // names that very variable), sent only to an origin allowed for it, and never over plain http off this machine.
  const cred = resolveCredential({ credential: cfg.policy.credential, apiKeyEnv: cfg.policy.apiKeyEnv, url: base, field: 'policy', fallback: 'policy' }, env);
  if (!cred.ok) {
    return [{ id: 'vllm', name: 'vLLM credential', status: 'fail', detail: cred.message, fix: 'nothing was sent: fix policy.credential / policy.baseUrl or the allowed origins as the message says' }];
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
          ? { id: 'vllm', name: 'vLLM reachable', status: 'fail', detail: `${base} wants a key (HTTP 401); doctor does not send ${keyVar} over plain http to a host that is not loopback`, fix: `serve it over https, or run halo doctor on that host (loopback)` }
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
  out.push(hasModel ? await vllmImageCheck(base, cfg.policy.model, headers, timeoutMs) : { id: 'vllm.image', name: 'vLLM image input', status: 'skip', detail: `${cfg.policy.model} is not served` });
  if (cfg.train.vllmBaseUrl === undefined && cfg.mcts.vllmBaseUrl === undefined) return out;
  // The adapter endpoint may be another server (train.vllmBaseUrl): its origin is checked for the key on its own.
  const rootCred = resolveCredential({ credential: cfg.policy.credential, apiKeyEnv: cfg.policy.apiKeyEnv, url: root, field: 'train.vllmBaseUrl', fallback: 'policy' }, env);
  if (!rootCred.ok) {
    out.push({ id: 'vllm.lora-runtime', name: 'vLLM runtime LoRA updating', status: 'fail', detail: rootCred.message, fix: 'nothing was sent: allow the origin as the message says, or point train.vllmBaseUrl at the policy server' });
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
    messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: PROBE_PNG_DATA_URL } }, { type: 'text', text: 'Describe the image in one word.' }] }],
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
    return { id: 'vllm.lora-rank', name, status: 'skip', detail: `no vLLM process on this machine to read --max-lora-rank from (adapters have rank ${rank})`, fix: `make sure it runs with --max-lora-rank ≥ ${rank}` };
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
  if (problems.length) return { id: 'vllm.lora-rank', name, status: 'fail', detail: problems.join('; '), fix: `restart vLLM with --enable-lora --max-lora-rank ${Math.max(rank, 64)} (./launch.sh gpu)` };
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
    if (i < 0 || !args.includes('serve') && !args.some((a) => a.includes('api_server'))) continue;
    const pi = args.indexOf('--port');
    if ((pi >= 0 ? args[pi + 1] : '8000') !== port) continue;
    return args;
  }
  return undefined;
}

function gpuCheck(): Promise<DoctorCheck> {
  const name = 'GPU memory';
  return new Promise((done) => {
    execFile('nvidia-smi', ['--query-gpu=index,name,memory.free,memory.total', '--format=csv,noheader,nounits'], { timeout: 15_000 }, (err, stdout) => {
      if (err) {
        const absent = (err as NodeJS.ErrnoException).code === 'ENOENT';
        done(
          absent
            ? { id: 'gpu', name, status: 'skip', detail: 'no nvidia-smi: no NVIDIA GPU on this machine (the learner runs on the CPU)' }
            : { id: 'gpu', name, status: 'fail', detail: `nvidia-smi failed: ${firstLine(err.message)}`, fix: 'check the NVIDIA driver (nvidia-smi)' },
        );
        return;
      }
      const gpus = stdout
        .trim()
        .split('\n')
        .filter(Boolean)
        .map((l) => {
          const [index, gpuName, free, total] = l.split(',').map((x) => x.trim());
          return { index, gpuName, free: Number(free), total: Number(total) };
        });
      const detail = gpus.map((g) => `GPU ${g.index} ${g.gpuName}: ${(g.free / 1024).toFixed(1)} of ${(g.total / 1024).toFixed(1)} GiB free`).join('; ');
      const low = gpus.some((g) => g.free < 1024);
      done(
        low
          ? { id: 'gpu', name, status: 'warn', detail, fix: 'another process holds the GPU (nvidia-smi lists it); vLLM and the learner share one GPU by --gpu-memory-utilization' }
          : { id: 'gpu', name, status: 'pass', detail },
      );
    });
  });
}

/** How long a watchdog restart stays a warning. */
const WATCHDOG_RECENT_MS = 24 * 3600_000;

/**
 * The learner restarts itself when its one activity slot stays busy past the activity's timeout
 * (workers/learner/halo_learner/watchdog.py) and leaves a record per queue and host under `<home>/learner/`:
 * a recent one is a warning, with what was stuck.
 */
export function learnerWatchdogCheck(home: string, queue: string, now = Date.now()): DoctorCheck {
  const name = 'learner watchdog';
  const dir = join(home, 'learner');
  const prefix = `watchdog-${queue}-`;
  let latest: { at: number; message?: string; activity_type?: string; workflow_id?: string } | undefined;
  for (const f of existsSync(dir) ? readdirSync(dir) : []) {
    if (!f.startsWith(prefix) || !f.endsWith('.json')) continue;
    try {
      const rec = JSON.parse(readFileSync(join(dir, f), 'utf8'));
      if (typeof rec?.at === 'number' && (!latest || rec.at > latest.at)) latest = rec;
    } catch {
      // a record being replaced, or not ours: the next run of doctor reads it
    }
  }
  if (!latest || now - latest.at * 1000 > WATCHDOG_RECENT_MS) {
    return { id: 'learner.watchdog', name, status: 'pass', detail: `no watchdog restart of the ${queue} learner in the last 24 h` };
  }
  return {
    id: 'learner.watchdog',
    name,
    status: 'warn',
    detail: `restarted itself ${new Date(latest.at * 1000).toISOString()}: ${latest.message ?? `${latest.activity_type} of ${latest.workflow_id} never completed`}`,
    fix: `read the learner's log around that time (${join(home, 'logs', 'learner.log')}): the attempt that held the slot names the run; its retry runs on the restarted learner`,
  };
}

function diskCheck(cfg: HaloConfig): DoctorCheck {
  const name = 'free disk';
  let dir = resolve(REPO_ROOT, cfg.stack.home);
  while (!existsSync(dir) && dirname(dir) !== dir) dir = dirname(dir);
  try {
    const s = statfsSync(dir);
    const free = (Number(s.bavail) * Number(s.bsize)) / GiB;
    const detail = `${free.toFixed(1)} GiB free at ${dir}`;
    if (free < 2) return { id: 'disk', name, status: 'fail', detail, fix: 'free some space: npx halo gc drops old blobs and adapters' };
    if (free < 20) return { id: 'disk', name, status: 'warn', detail, fix: 'the 8B model takes about 17 GiB in the Hugging Face cache; npx halo gc drops old blobs and adapters' };
    return { id: 'disk', name, status: 'pass', detail };
  } catch (err) {
    return { id: 'disk', name, status: 'skip', detail: firstLine((err as Error).message) };
  }
}

function firstLine(s: string): string {
  return (s.split('\n').find((l) => l.trim()) ?? s).trim().slice(0, 300);
}

const MARK: Record<CheckStatus, string> = { pass: 'pass', warn: 'WARN', fail: 'FAIL', skip: 'skip' };

/** The report as a plain table: check, status, detail, and on the next line what to do. */
export function formatDoctor(r: DoctorReport): string {
  const w = Math.max(...r.checks.map((c) => c.name.length));
  const lines = r.checks.map((c) => `${c.name.padEnd(w)}  ${MARK[c.status]}  ${c.detail}${c.fix && c.status !== 'pass' ? `\n${' '.repeat(w + 8)}fix: ${c.fix}` : ''}`);
  const n = (s: CheckStatus) => r.checks.filter((c) => c.status === s).length;
  lines.push('', `${n('pass')} passed, ${n('fail')} failed, ${n('warn')} warnings, ${n('skip')} skipped`);
  return lines.join('\n');
}
