import { ApplicationFailure, Context } from '@temporalio/activity';
import { servedAdapterName, type ServedAdapter } from '../lib/serving/iteration-policy';
import { clipErrorText, type CredentialName } from '../lib/serving/credentials';
import type { ReplicaStats } from '../lib/serving/policy-pool';
import { checkAdapterFolder } from './adapter-check';
import { apiKeyFor } from './credentials';
import { poolOf } from './replica-pools';

/**
 * Hot-loading the learner's adapters into vLLM through its runtime LoRA API (server started with
 * `--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`):
 *
 *   POST /v1/load_lora_adapter   {"lora_name", "lora_path"}  200 "Success: LoRA adapter 'x' added successfully."
 *   POST /v1/unload_lora_adapter {"lora_name"}               200 "Success: LoRA adapter 'x' removed successfully."
 *   GET  /v1/models                                          base model + one card per adapter (id = lora_name)
 *
 * Errors are `{"error": {"message", "type", "param", "code"}}` (older vLLM: the same keys at top level with
 * `"object": "error"`). One name per version (`<run_id>-v<N>`) rather than `load_inplace`, so a request that
 * names a version is served by exactly that version, and the previous one stays available while episodes
 * sampled with it finish.
 *
 * A restarted vLLM has forgotten every runtime adapter and answers a request naming one with 404 "The model
 * `<name>` does not exist.": sampling goes through `withServedAdapter` (load if needed, reload and repeat on
 * that 404), and `ensureAdapters` reloads what open runs need after `halo up` / `halo resume`.
 *
 * No retries here: Temporal owns them. Unreachable server, timeouts, 5xx, 408/429 → retryable; any other 4xx
 * (missing adapter folder, runtime updating disabled) → non-retryable with vLLM's own message. A rank above the
 * server's `--max-lora-rank` is a 500 from vLLM 0.24 on (the engine's ValueError, `Call to add_lora method failed:
 * LoRA rank R is greater than max_lora_rank M.`), yet no retry can change it: non-retryable, naming the flag.
 */
const RANK_TOO_HIGH = /LoRA rank (\d+) is greater than max_lora_rank (\d+)/;

export interface LoadAdapterInput {
  /** vLLM's address, with or without the OpenAI `/v1` suffix: `http://127.0.0.1:8000` or `http://127.0.0.1:8000/v1`. */
  base_url: string;
  run_id: string;
  version: number;
  /** The version folder as the vLLM server sees it (adapter_config.json + adapter_model.safetensors). */
  adapter_path: string;
  /** Older versions of this run to keep loaded besides the new one; default 1. */
  keep?: number;
  /** Per HTTP request; default 120 s (a first load reads the weights from disk). */
  timeout_ms?: number;
  /** For servers started with --api-key: the key by name (the worker maps it to its environment); default `policy`. */
  credential?: CredentialName;
  /** Deprecated: accepted only when it names the variable the worker maps the credential to. */
  api_key_env?: string;
  /**
   * A pool of servers (`policy.baseUrls`): the adapter goes into each of them (older versions unloaded on each),
   * `base_url` being one of them. A replica that cannot be reached is skipped (drained; it loads the adapter on its
   * first request when it is back); a refusal is the adapter's fault and fails the call.
   */
  replicas?: string[];
}

export interface LoadAdapterResult {
  /** The name to put in `model` of chat requests. */
  name: string;
  /** False when vLLM already had it (a retried activity, or a second call). */
  loaded: boolean;
  /** Names unloaded by this call. */
  unloaded: string[];
  /** This run's adapters loaded after the call, oldest first. */
  run_adapters: string[];
  /** With `replicas`: those that were skipped (unreachable) and why. */
  skipped?: { url: string; message: string }[];
  /** With `replicas`: what each replica did in this worker so far (the run's metrics row carries it). */
  pool?: ReplicaStats[];
}

export interface LoadedModel {
  id: string;
  root?: string;
  parent?: string | null;
}

/** The served name of adapter v<N> of a run: the one naming rule (lib/serving/iteration-policy.ts). */
export const adapterName = servedAdapterName;

const RETRYABLE_4XX = new Set([408, 425, 429]);
const ALREADY_LOADED = /has already been loaded/i;
const NOT_FOUND_ON_UNLOAD = /cannot be found/i;

/** The server's root (without `/v1`), so both config styles work. */
export function serverRoot(baseUrl: string): string {
  return baseUrl.replace(/\/+$/, '').replace(/\/v1$/, '');
}

export async function loadAdapterIntoVllm(input: LoadAdapterInput): Promise<LoadAdapterResult> {
  const replicas = input.replicas;
  if (replicas === undefined || replicas.length <= 1) return loadIntoOne(input);
  if (!Array.isArray(replicas) || !replicas.some((r) => serverRoot(r) === serverRoot(input.base_url ?? ''))) {
    throw badInput(`replicas ${JSON.stringify(replicas)}: a list of the pool's servers, base_url ${JSON.stringify(input.base_url)} among them`);
  }
  const pool = poolOf({ baseUrl: input.base_url, baseUrls: replicas });
  const skipped: { url: string; message: string }[] = [];
  let first: LoadAdapterResult | undefined;
  for (const url of replicas) {
    try {
      const res = await loadIntoOne({ ...input, base_url: url });
      pool.loads(url, 1);
      first ??= res;
    } catch (err) {
      if (!(err instanceof ApplicationFailure) || err.nonRetryable) throw err;
      pool.unreachable(url, Date.now());
      skipped.push({ url, message: clipErrorText(err.message, 300) });
    }
  }
  if (!first) {
    throw ApplicationFailure.create({
      message: `no policy replica took adapter ${adapterName(input.run_id, input.version)}: ${skipped.map((s) => `${s.url}: ${s.message}`).join('; ')}`,
      type: 'VllmUnreachable',
      nonRetryable: false,
    });
  }
  return { ...first, ...(skipped.length > 0 ? { skipped } : {}), pool: pool.stats(Date.now()) };
}

/** `loadAdapterIntoVllm` on one server. */
async function loadIntoOne(input: LoadAdapterInput): Promise<LoadAdapterResult> {
  const { run_id, version, adapter_path } = input;
  const keep = input.keep ?? 1;
  if (!/^[A-Za-z0-9._-]+$/.test(run_id ?? '')) throw badInput(`run_id ${JSON.stringify(run_id)}: letters, digits, ".", "_" and "-" only`);
  if (!Number.isInteger(version) || version < 1) throw badInput(`version ${version}: an integer ≥ 1`);
  if (!Number.isInteger(keep) || keep < 0) throw badInput(`keep ${keep}: an integer ≥ 0`);
  if (!adapter_path) throw badInput('adapter_path is empty');
  const http = new VllmHttp(input);
  const name = adapterName(run_id, version);
  await checkAdapterFolder(adapter_path, name);

  // Versions of this run older than this one, beyond the `keep` newest of them, go first: that frees their
  // slots before the new adapter takes one. Newer versions (a late retry of an old load) are left alone.
  const before = runVersions(await http.models(), run_id);
  const older = before.filter((v) => v < version).sort((a, b) => b - a);
  const unloaded: string[] = [];
  for (const v of older.slice(keep)) {
    const n = adapterName(run_id, v);
    const res = await http.post('/v1/unload_lora_adapter', { lora_name: n });
    if (res.ok || (res.status === 404 && NOT_FOUND_ON_UNLOAD.test(res.message))) unloaded.push(n);
    else throw http.failure(res, `unloading ${n}`);
  }

  const res = await http.post('/v1/load_lora_adapter', { lora_name: name, lora_path: adapter_path });
  let loaded = true;
  if (!res.ok) {
    if (res.status === 400 && ALREADY_LOADED.test(res.message)) loaded = false;
    else throw http.failure(res, `loading ${name} from ${adapter_path}`);
  }
  const names = knownServed(input.base_url);
  for (const n of unloaded) names.delete(n);
  names.add(name);
  const after = runVersions(await http.models(), run_id).sort((a, b) => a - b);
  return { name, loaded, unloaded, run_adapters: after.map((v) => adapterName(run_id, v)) };
}

/** An adapter as vLLM knows it: the served name and the folder it is read from (as the vLLM server sees it). */
export interface AdapterFolder {
  lora_name: string;
  /** Absolute: vLLM takes a relative path it cannot find for a Hugging Face repo id and tries to download it. */
  lora_path: string;
}

export interface EnsureAdapterInput extends ServedAdapter {
  timeout_ms?: number;
  credential?: CredentialName;
  api_key_env?: string;
}

/**
 * Makes sure vLLM serves `lora_name` from `lora_path`, whatever it forgot (a restarted server has no runtime
 * adapters): one load request, where "has already been loaded" (400) counts as success. Returns whether this
 * call loaded it. Failures are classified like `loadAdapterIntoVllm`'s (a missing folder is non-retryable).
 */
export async function ensureAdapterLoaded(input: EnsureAdapterInput): Promise<{ loaded: boolean }> {
  checkServedAdapter(input);
  await checkAdapterFolder(input.lora_path, input.lora_name);
  const http = new VllmHttp(input);
  const res = await http.post('/v1/load_lora_adapter', { lora_name: input.lora_name, lora_path: input.lora_path });
  if (res.ok) return { loaded: true };
  if (res.status === 400 && ALREADY_LOADED.test(res.message)) return { loaded: false };
  throw http.failure(res, `loading ${input.lora_name} from ${input.lora_path}`);
}

export interface EnsureAdaptersInput {
  base_url: string;
  adapters: AdapterFolder[];
  timeout_ms?: number;
  credential?: CredentialName;
  api_key_env?: string;
}

export interface EnsureAdaptersResult {
  /** Loaded by this call (the server had forgotten them). */
  loaded: string[];
  /** Already served. */
  present: string[];
  /** Refused for good (folder gone, bad adapter): the runs that need them fail when they sample. */
  failed: { lora_name: string; message: string }[];
}

/**
 * Reloads the adapters that open runs and evaluations sample from (`halo up`, `halo resume`, after vLLM
 * restarted). A refusal of one adapter is reported and the others are still loaded; a server that is down or
 * failing fails the whole call, retryably.
 */
export async function ensureAdapters(input: EnsureAdaptersInput): Promise<EnsureAdaptersResult> {
  if (!Array.isArray(input?.adapters)) throw badInput('ensureAdapters needs { base_url, adapters: [{ lora_name, lora_path }] }');
  for (const a of input.adapters) checkServedAdapter(a);
  const out: EnsureAdaptersResult = { loaded: [], present: [], failed: [] };
  for (const a of input.adapters) {
    try {
      const r = await ensureAdapterLoaded({ ...a, base_url: input.base_url, timeout_ms: input.timeout_ms, credential: input.credential, api_key_env: input.api_key_env });
      (r.loaded ? out.loaded : out.present).push(a.lora_name);
    } catch (err) {
      if (!(err instanceof ApplicationFailure) || !err.nonRetryable) throw err;
      out.failed.push({ lora_name: a.lora_name, message: err.message });
    }
  }
  for (const name of [...out.loaded, ...out.present]) knownServed(input.base_url).add(name);
  return out;
}

/** Adapter names this process saw vLLM serve, per server: sampling skips the load request for them. */
const served = new Map<string, Set<string>>();

function knownServed(baseUrl: string): Set<string> {
  const key = serverRoot(baseUrl);
  let names = served.get(key);
  if (!names) {
    names = new Set();
    served.set(key, names);
  }
  return names;
}

/** Load requests in flight, by server and adapter name. */
const loading = new Map<string, Promise<{ loaded: boolean }>>();

export interface AdapterCallStats {
  /** Load requests made for this call (0 when the adapter was known to be served and was). */
  loadRequests: number;
  /** Milliseconds spent in them. */
  loadMs: number;
  /** The server did not know the adapter (restarted): it was loaded again and the call repeated. */
  reloaded: boolean;
}

/**
 * Runs `call` (a request that names `adapter.lora_name` as its model) with the adapter served: loaded first
 * unless this process already saw it served, and on a 404 for exactly that name (`missingModel` reads it off
 * the failure) loaded again and the call repeated once. A 404 for any other model is the call's own failure.
 * A second 404 right after a successful load (the server restarted once more) is retryable: the next attempt
 * loads again.
 */
export async function withServedAdapter<T>(
  adapter: EnsureAdapterInput,
  call: () => Promise<T>,
  missingModel: (err: unknown) => string | undefined,
): Promise<{ value: T; stats: AdapterCallStats }> {
  const stats: AdapterCallStats = { loadRequests: 0, loadMs: 0, reloaded: false };
  const names = knownServed(adapter.base_url);
  const load = async () => {
    const t0 = Date.now();
    // Calls that find the adapter missing at the same time (a replica back from a restart) share one load request.
    const key = `${serverRoot(adapter.base_url)} ${adapter.lora_name}`;
    let pending = loading.get(key);
    if (!pending) {
      stats.loadRequests++;
      pending = ensureAdapterLoaded(adapter).finally(() => loading.delete(key));
      loading.set(key, pending);
    }
    try {
      await pending;
    } finally {
      stats.loadMs += Date.now() - t0;
    }
    names.add(adapter.lora_name);
  };
  if (!names.has(adapter.lora_name)) await load();
  try {
    return { value: await call(), stats };
  } catch (err) {
    if (missingModel(err) !== adapter.lora_name) throw err;
    names.delete(adapter.lora_name);
  }
  await load();
  stats.reloaded = true;
  try {
    return { value: await call(), stats };
  } catch (err) {
    if (missingModel(err) !== adapter.lora_name) throw err;
    names.delete(adapter.lora_name);
    throw ApplicationFailure.create({
      message: `vLLM at ${serverRoot(adapter.base_url)} lost adapter ${adapter.lora_name} again right after loading it (restarting?): ${(err as Error).message}`,
      type: 'VllmAdapterLost',
      nonRetryable: false,
    });
  }
}

function checkServedAdapter(a: Partial<AdapterFolder> | undefined): void {
  if (!a || !/^[A-Za-z0-9._-]+$/.test(a.lora_name ?? '')) {
    throw badInput(`lora_name ${JSON.stringify(a?.lora_name)}: letters, digits, ".", "_" and "-" only`);
  }
  if (typeof a.lora_path !== 'string' || !a.lora_path.startsWith('/')) {
    throw badInput(`lora_path ${JSON.stringify(a.lora_path)} of ${a.lora_name}: an absolute path (vLLM reads a relative one as a Hugging Face repo id)`);
  }
}

/** Everything vLLM serves now (`GET /v1/models`): the base model(s) and every loaded adapter. */
export async function listLoadedAdapters(input: { base_url: string; timeout_ms?: number; credential?: CredentialName; api_key_env?: string }): Promise<LoadedModel[]> {
  return new VllmHttp(input).models();
}

function runVersions(models: LoadedModel[], runId: string): number[] {
  const out: number[] = [];
  for (const m of models) {
    if (!m.id.startsWith(`${runId}-v`)) continue;
    const rest = m.id.slice(runId.length + 2);
    if (/^[1-9][0-9]*$/.test(rest)) out.push(Number(rest));
  }
  return out;
}

function badInput(msg: string): ApplicationFailure {
  return ApplicationFailure.create({ message: `adapter request: ${msg}`, type: 'InvalidAdapterRequest', nonRetryable: true });
}

interface HttpAnswer {
  ok: boolean;
  status: number;
  /** vLLM's message (error.message, message, detail) or the raw body. */
  message: string;
  errorType?: string;
  body: unknown;
}

class VllmHttp {
  readonly root: string;
  private readonly timeoutMs: number;
  private readonly apiKey: string | undefined;

  constructor(o: { base_url: string; timeout_ms?: number; credential?: CredentialName; api_key_env?: string }) {
    if (!/^https?:\/\//.test(o.base_url ?? '')) {
      throw badInput(`base_url ${JSON.stringify(o.base_url)} is not an http(s) URL`);
    }
    this.root = serverRoot(o.base_url);
    this.timeoutMs = o.timeout_ms ?? 120_000;
    this.apiKey = apiKeyFor({ credential: o.credential, apiKeyEnv: o.api_key_env, url: o.base_url, field: 'adapter request', fallback: 'policy' });
  }

  async models(): Promise<LoadedModel[]> {
    const res = await this.request('GET', '/v1/models');
    if (!res.ok) throw this.failure(res, 'listing models');
    const data = (res.body as { data?: unknown })?.data;
    if (!Array.isArray(data)) throw this.failure({ ...res, ok: false, message: 'GET /v1/models answered without a data list' }, 'listing models');
    return data
      .filter((m): m is LoadedModel => typeof m === 'object' && m !== null && typeof (m as LoadedModel).id === 'string')
      .map((m) => ({ id: m.id, root: m.root, parent: m.parent }));
  }

  post(path: string, body: unknown): Promise<HttpAnswer> {
    return this.request('POST', path, body);
  }

  private async request(method: 'GET' | 'POST', path: string, body?: unknown): Promise<HttpAnswer> {
    const url = this.root + path;
    const signals = [AbortSignal.timeout(this.timeoutMs)];
    const cancel = activitySignal();
    if (cancel) signals.push(cancel);
    const headers: Record<string, string> = { accept: 'application/json' };
    if (body !== undefined) headers['content-type'] = 'application/json';
    if (this.apiKey) headers.authorization = `Bearer ${this.apiKey}`;
    let res: Response;
    let text: string;
    try {
      res = await fetch(url, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.any(signals),
      });
      text = await res.text();
    } catch (err) {
      if (cancel?.aborted) throw err; // the activity was cancelled: let the SDK report that
      const e = err as Error & { cause?: { code?: string; message?: string } };
      const why = e.name === 'TimeoutError' ? `no answer within ${this.timeoutMs / 1000}s` : (e.cause?.code ?? e.cause?.message ?? e.message);
      throw ApplicationFailure.create({
        message: `vLLM at ${this.root} unreachable (${method} ${path}: ${why}). Is it running, started with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True?`,
        type: 'VllmUnreachable',
        nonRetryable: false,
      });
    }
    let parsed: unknown = text;
    try {
      parsed = text ? JSON.parse(text) : '';
    } catch {
      /* success answers are plain text */
    }
    const { message, type } = errorMessage(parsed, text);
    return { ok: res.ok, status: res.status, message, errorType: type, body: parsed };
  }

  failure(res: HttpAnswer, doing: string): ApplicationFailure {
    // The server's text lands in the failure and so in the workflow history: clipped.
    const said = clipErrorText(res.message);
    const errorType = res.errorType === undefined ? undefined : clipErrorText(res.errorType, 100);
    const details = [{ status: res.status, type: errorType ?? null, message: said }];
    let message = `vLLM at ${this.root} refused ${doing}: HTTP ${res.status}${errorType ? ` ${errorType}` : ''}: ${said}`;
    if (res.status === 404 && res.message === 'Not Found') {
      message += ' (the runtime LoRA endpoints are missing: start vLLM with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)';
    }
    if (res.status === 401 || res.status === 403) message += ' (check the API key variable)';
    const rank = RANK_TOO_HIGH.exec(res.message);
    if (rank) {
      message += ` (the adapter's rank ${rank[1]} is above vLLM's --max-lora-rank ${rank[2]}: restart vLLM with --max-lora-rank of at least ${rank[1]}; docker-compose.yml and ./launch.sh gpu derive it from HALO_LORA_RANK)`;
    }
    const retryable = !rank && (res.status >= 500 || RETRYABLE_4XX.has(res.status));
    return ApplicationFailure.create({
      message,
      type: retryable ? 'VllmServerError' : 'VllmAdapterRejected',
      nonRetryable: !retryable,
      details,
    });
  }
}

/** vLLM's error shapes: `{"error": {...}}` (current), `{"object": "error", "message": ...}` (older), FastAPI `{"detail": ...}`. */
function errorMessage(body: unknown, raw: string): { message: string; type?: string } {
  if (body && typeof body === 'object') {
    const b = body as { error?: { message?: unknown; type?: unknown }; message?: unknown; type?: unknown; detail?: unknown };
    if (b.error && typeof b.error === 'object' && typeof b.error.message === 'string') {
      return { message: b.error.message, type: typeof b.error.type === 'string' ? b.error.type : undefined };
    }
    if (typeof b.message === 'string') return { message: b.message, type: typeof b.type === 'string' ? b.type : undefined };
    if (typeof b.detail === 'string') return { message: b.detail };
    if (b.detail !== undefined) return { message: JSON.stringify(b.detail) };
  }
  return { message: raw.trim() }; // clipped where it goes into a failure (failure())
}

/** The activity's cancellation signal; none outside a worker (scripts, tests). */
function activitySignal(): AbortSignal | undefined {
  try {
    return Context.current().cancellationSignal;
  } catch {
    return undefined;
  }
}

export const adapterActivities = { loadAdapterIntoVllm, listLoadedAdapters, ensureAdapters };
export type AdapterActivities = typeof adapterActivities;
