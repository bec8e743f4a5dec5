import { spawnSync } from 'node:child_process';
import { statSync } from 'node:fs';
import { resolve } from 'node:path';
import { Client } from '@temporalio/client';
import { defaultPayloadConverter, WorkflowNotFoundError } from '@temporalio/common';
import type { Command } from 'commander';
import type { HaloConfig } from '../../lib/config/config';
import { blobStoreFor, type BlobStore, type StoreWriter } from '../../blob/store';
import { checkGrace, collectBlobGarbage, DEFAULT_GC_GRACE_MS, formatBytes, GcAbortedError, MIN_GC_GRACE_MS, type GcReport } from '../../host/blob-gc';
import { learnerCommand } from '../processes';
import { configuredVllmUrls, servedVersions } from '../served-versions';
import { connectClient, stackStatus } from '../stack';

/**
 * `halo gc`: mark and sweep over the blob store. Live blobs are those named by a workflow history the server
 * still keeps (running or closed: runs, evaluations, episodes, searches), by a text file under the home folder
 * (metrics rows, eval records, snapshots, ledgers), or by a live text blob (trajectories → screenshots, batches
 * → prompts, eval records → trajectories); the rest goes once older than the grace period (`host/blob-gc.ts`).
 * Any history, file or blob that cannot be read (other than "not found") stops it before anything is deleted.
 *
 * A shared object store (`HALO_STORE=s3://…`) is written by the workers of every host, each with its own home
 * folder, and perhaps by several namespaces: its sweep reads every home given with `--home` and every
 * namespace given with `--namespace`, and deletes only with `--all-writers-listed`, the operator's word that
 * those are all of them (a dry run needs no such word: it deletes nothing).
 *
 * `halo gc --run <id>`: adapter retention for one run's checkpoints, by the learner's own rules
 * (workers/learner/halo_learner/retention.py): the last K versions whole, older ones without optimiser state,
 * with --delete older ones removed unless they are milestones (every --keep-every) or needed: named with
 * --need, or found needed by an open workflow (`openRunNeeds`).
 */
export function register(program: Command, ctx: { loadConfig: (path?: string) => HaloConfig }): void {
  const many = (v: string, prev: string[]) => [...prev, v];
  program
    .command('gc')
    .description("remove blobs nothing references (mark and sweep); with --run, prune that run's adapter versions instead")
    .option('--dry-run', 'print what would go, change nothing')
    .option('--grace <minutes>', `keep unreferenced blobs younger than this (writes not yet recorded; at least ${MIN_GC_GRACE_MS / 60_000})`, String(DEFAULT_GC_GRACE_MS / 60_000))
    .option('--json', 'print the report as JSON')
    .option('--home <dir>', "also read this home folder's files for references (repeatable: every host that writes to a shared HALO_STORE)", many, [])
    .option('--namespace <ns>', "read this namespace's histories (repeatable; default the config's namespace)", many, [])
    .option('--all-writers-listed', 'with HALO_STORE=s3://…: confirm that the homes and namespaces read are every writer of the store')
    .option('--run <id>', 'adapter retention for this run (checkpoints/<id>/v<N>) instead of the blob store')
    .option('--keep-last <k>', 'with --run: versions kept whole (1 or more)', '3')
    .option('--keep-every <n>', 'with --run --delete: keep every n-th version (weights only)', '10')
    .option('--need <version...>', 'with --run: versions never touched, besides those open runs and evaluations still need (found in Temporal)')
    .option('--delete', 'with --run: delete old versions, not only their optimiser state')
    .action(
      async (opts: {
        run?: string;
        keepLast: string;
        keepEvery: string;
        need?: string[];
        delete?: boolean;
        dryRun?: boolean;
        grace: string;
        json?: boolean;
        home: string[];
        namespace: string[];
        allWritersListed?: boolean;
      }) => {
        const cfg = ctx.loadConfig(program.opts().config);
        if (opts.run) {
          const run = opts.run;
          retentionArgs({ ...opts, run }, { versions: [], reasons: [] }); // bad flags fail before connecting
          const { connection, clients } = await connectNamespaces(cfg, opts.namespace);
          let needs: OpenRunNeeds;
          try {
            needs = await retentionNeeds(clients, run, configuredVllmUrls(cfg), (m) => console.error(`halo gc: ${m}`));
          } finally {
            await connection.close();
          }
          for (const r of needs.reasons) console.error(`halo gc: keeping ${r}`);
          const { command, env } = learnerCommand();
          const args = retentionArgs({ ...opts, run }, needs);
          const r = spawnSync(command, args, { env, stdio: 'inherit' });
          if (r.error) throw r.error;
          if (r.status !== 0) process.exitCode = r.status ?? 1;
          return;
        }
        const graceMs = parseGraceMinutes(opts.grace);
        const homes = opts.home.map((h) => resolve(h));
        const { connection, clients } = await connectNamespaces(cfg, opts.namespace);
        try {
          const report = await gcBlobs(cfg, clients, { dryRun: Boolean(opts.dryRun), graceMs, homes, allWritersListed: Boolean(opts.allWritersListed) });
          if (opts.json) console.log(JSON.stringify({ ...report, removedRefs: undefined }));
          else console.log(describeGc(report));
        } finally {
          await connection.close();
        }
      },
    );
}

/**
 * The arguments of `python -m halo_learner.retention` for `halo gc --run`: --keep-last of 1 or more (the newest
 * version is the next update's parent and holds the optimiser state a restarted learner resumes from), the
 * versions given with --need and those open workflows need (`openRunNeeds`).
 */
export function retentionArgs(o: { run: string; keepLast: string; keepEvery: string; need?: string[]; delete?: boolean; dryRun?: boolean }, needs: OpenRunNeeds): string[] {
  const keepLast = Number(o.keepLast);
  if (!/^\d+$/.test(o.keepLast.trim()) || keepLast < 1) {
    throw new Error(`--keep-last ${o.keepLast}: 1 or more (the newest version is the next update's parent and holds the optimiser state a restarted learner resumes from)`);
  }
  if (!/^\d+$/.test(o.keepEvery.trim())) throw new Error(`--keep-every ${o.keepEvery}: a whole number (0: no milestones)`);
  for (const v of o.need ?? []) if (!/^\d+$/.test(v)) throw new Error(`--need ${v}: a version number`);
  const args = ['-m', 'halo_learner.retention', '--run', o.run, '--keep-last', String(keepLast), '--keep-every', o.keepEvery.trim()];
  for (const v of [...new Set([...(o.need ?? []).map(Number), ...needs.versions])].sort((a, b) => a - b)) args.push('--need', String(v));
  if (needs.from !== undefined) args.push('--need-from', String(needs.from));
  if (o.delete) args.push('--delete');
  if (o.dryRun) args.push('--dry-run');
  return args;
}

/** `--grace <minutes>` in ms: a number of minutes, at least MIN_GC_GRACE_MS. */
export function parseGraceMinutes(s: string): number {
  const min = Number(s);
  if (s.trim() === '' || !Number.isFinite(min)) throw new Error(`--grace ${s}: a number of minutes, at least ${MIN_GC_GRACE_MS / 60_000}`);
  try {
    return checkGrace(min * 60_000);
  } catch (err) {
    throw new Error(`--grace ${s}: ${(err as Error).message}`);
  }
}

/** One client per namespace on one connection (the config's namespace when none is given). */
async function connectNamespaces(cfg: HaloConfig, namespaces: string[]): Promise<{ connection: { close(): Promise<void> }; clients: Client[] }> {
  const { client, connection } = await connectClient(cfg);
  const names = [...new Set(namespaces)];
  if (names.length === 0) return { connection, clients: [client] };
  return { connection, clients: names.map((namespace) => (namespace === client.options.namespace ? client : new Client({ connection, namespace }))) };
}

/** Whether a Temporal error means the workflow (or its history) is not there: deleted by retention, say. */
export function isNotFound(err: unknown): boolean {
  return err instanceof WorkflowNotFoundError || (err as { code?: number })?.code === 5 /* gRPC NOT_FOUND */;
}

/**
 * The text of every workflow history the namespace still keeps (payloads decoded), one history at a time. A
 * workflow whose history is gone since the listing names nothing; any other failure (server busy, deadline,
 * rate limit, permission) throws GcAbortedError naming the workflow, so that a sweep deletes nothing.
 */
export async function* historyTexts(client: Client, query?: string): AsyncGenerator<string> {
  const ns = client.options.namespace;
  for await (const wf of client.workflow.list(query ? { query } : undefined)) {
    let history: unknown;
    try {
      history = await client.workflow.getHandle(wf.workflowId, wf.runId).fetchHistory();
    } catch (err) {
      if (isNotFound(err)) continue;
      throw new GcAbortedError(`the history of workflow ${wf.workflowId} (run ${wf.runId}) in namespace ${ns}`, err);
    }
    const parts: string[] = [];
    const walk = (v: unknown): void => {
      if (typeof v === 'string') parts.push(v);
      else if (v instanceof Uint8Array) parts.push(Buffer.from(v).toString('utf8'));
      else if (Array.isArray(v)) v.forEach(walk);
      else if (v && typeof v === 'object') for (const x of Object.values(v)) walk(x);
    };
    walk(history);
    yield parts.join('\n');
  }
}

async function* allHistories(clients: Client[]): AsyncGenerator<string> {
  for (const c of clients) yield* historyTexts(c);
}

export interface GcBlobsOptions {
  dryRun: boolean;
  /** At least MIN_GC_GRACE_MS (default DEFAULT_GC_GRACE_MS). */
  graceMs?: number;
  /** This host's home (default the config's stack.home): its files are read, and its blobs folder swept. */
  home?: string;
  /** Further home folders whose files name blobs (other hosts' runs folders, mounted or copied here). */
  homes?: string[];
  /** Required to delete from an object store: the homes and namespaces read are every writer of it. */
  allWritersListed?: boolean;
  /** The store (default blobStoreFor(home)); tests. */
  store?: BlobStore;
}

/**
 * Mark (histories of every client's namespace, the home folders' text files, live text blobs) and sweep of
 * the blob store: the folder `<home>/blobs`, or with `HALO_STORE=s3://bucket/prefix` the keys under
 * `<prefix>/blobs/` (nothing else in the bucket is listed or deleted).
 *
 * The shared-store rule: an object store may be written by workers of several hosts (each with its own home
 * folder) and of several namespaces, and a blob named only by one of them looks unreferenced to a sweep that
 * reads the others. So a sweep that deletes from an object store needs `allWritersListed`: the operator's word
 * that `homes` (with this host's home) and the clients' namespaces cover every writer. Without it only a dry
 * run goes ahead. A folder store is reached by one disk, and so by the homes that share it; the same flags
 * add roots there but are not required.
 *
 * On either kind, several namespaces may share the store (two stacks on one home, one bucket): every worker
 * records its namespace in the store before it writes (`BlobStore.recordWriter`), and a sweep that does not
 * read every recorded namespace deletes nothing (a dry run reports them as unread).
 */
export async function gcBlobs(cfg: HaloConfig, clients: Client | Client[], o: GcBlobsOptions): Promise<GcReport> {
  const graceMs = checkGrace(o.graceMs ?? DEFAULT_GC_GRACE_MS);
  const list = Array.isArray(clients) ? clients : [clients];
  const home = o.home ?? stackStatus(cfg).home;
  const homes = [...new Set([home, ...(o.homes ?? []).map((h) => resolve(h))])];
  for (const h of o.homes ?? []) {
    // A home named on purpose that is not there (a mount that failed, a typo) would name nothing.
    const st = statSync(h, { throwIfNoEntry: false });
    if (!st?.isDirectory()) throw new Error(`--home ${h}: not a folder; nothing was deleted`);
  }
  const store = o.store ?? blobStoreFor(home);
  if (store.isObjectStore && !o.dryRun && !o.allWritersListed) {
    throw new Error(
      [
        `halo gc: the blob store ${store.root} is shared: workers of several hosts and namespaces may write to it, and a blob named only by`,
        `another host's home folder or another namespace's histories would look unreferenced and be deleted. This sweep would read`,
        `  homes:      ${homes.join(', ')}`,
        `  namespaces: ${list.map((c) => c.options.namespace).join(', ')}`,
        `Give every writer's home (--home DIR, repeatable: each host's runs folder, mounted or copied here) and namespace`,
        `(--namespace NS, repeatable), then confirm with --all-writers-listed. --dry-run needs no confirmation. Nothing was deleted.`,
      ].join('\n'),
    );
  }
  const unread = await unreadWriters(store, list);
  if (unread.length > 0 && !o.dryRun) {
    const read = list.map((c) => c.options.namespace);
    const all = [...new Set([...read, ...unread.map((w) => w.namespace)])];
    throw new Error(
      [
        `halo gc: namespace${unread.length > 1 ? 's' : ''} ${unread.map((w) => w.namespace).join(', ')} also write${unread.length > 1 ? '' : 's'} to the blob store ${store.root}, and this sweep`,
        `reads only ${read.join(', ')}: a blob that only a ${unread[0].namespace} workflow names would look unreferenced and be deleted.`,
        ...unread.map((w) => `  ${w.namespace}: recorded in ${w.where}${w.address ? ` (Temporal at ${w.address}${w.host ? `, host ${w.host}` : ''})` : ''}`),
        `Read every namespace: ${all.map((n) => `--namespace ${n}`).join(' ')}. If a namespace no longer uses this store, remove its record.`,
        `--dry-run needs neither. Nothing was deleted.`,
      ].join('\n'),
    );
  }
  const report = await collectBlobGarbage({ store, rootPaths: homes, rootTexts: allHistories(list), graceMs, dryRun: o.dryRun });
  return unread.length > 0 ? { ...report, unreadNamespaces: unread.map((w) => w.namespace) } : report;
}

/**
 * The writers recorded in the store (workers record their namespace before writing: `BlobStore.recordWriter`)
 * whose namespace none of the clients reads. Their histories may name blobs nothing else names.
 */
export async function unreadWriters(store: BlobStore, clients: Client[]): Promise<StoreWriter[]> {
  const read = new Set(clients.map((c) => c.options.namespace));
  const seen = new Set<string>();
  return (await store.writers()).filter((w) => !read.has(w.namespace) && !seen.has(w.namespace) && seen.add(w.namespace));
}

export function describeGc(r: GcReport): string {
  const verb = r.dryRun ? 'would free' : 'freed';
  return [
    `blob store ${r.where}: ${r.blobs} blobs, ${formatBytes(r.bytes)}; live ${r.live} (${formatBytes(r.liveBytes)}); kept as too recent ${r.young}`,
    `${r.dryRun ? 'would remove' : 'removed'} ${r.removed} blobs and ${r.tempFilesRemoved} abandoned temp files: ${verb} ${formatBytes(r.bytesFreed)}` +
      (r.missing ? ` (${r.missing} referenced blobs were already missing)` : ''),
    ...(r.unreadNamespaces?.length
      ? [`not read: namespace ${r.unreadNamespaces.join(', ')} writes to this store; blobs only its workflows name are counted as removable above`]
      : []),
  ].join('\n');
}

/**
 * What `halo gc --run` keeps besides the last K: versions open workflows need (`openRunNeeds`) and versions a vLLM
 * of the config serves now (`servedVersions`). Either unknown: an Error, and nothing is changed.
 */
export async function retentionNeeds(clients: Client | Client[], run: string, vllmUrls: string[], say: (msg: string) => void): Promise<OpenRunNeeds> {
  const needs = await openRunNeeds(clients, run);
  const served = await servedVersions(vllmUrls, run);
  for (const u of served.unreachable) say(`vLLM at ${u} is not running: it serves no adapter now`);
  return { ...needs, versions: [...new Set([...needs.versions, ...served.versions])].sort((a, b) => a - b), reasons: [...needs.reasons, ...served.reasons] };
}

export interface OpenRunNeeds {
  /** Versions an open workflow names (an evaluation's mode, an episode's or search's sampling adapter). */
  versions: number[];
  /** Every version from this one up: an open training run's current adapter, its parent and what it writes next. */
  from?: number;
  /** One line per workflow that needs something, for the operator. */
  reasons: string[];
}

const TRAINING_TYPES = new Set(['trainGrpo', 'trainMcts']);

/**
 * The adapter versions of `run` that open workflows may still need, found in Temporal: every running workflow
 * (visibility, in each client's namespace) and the input of its current run (its history's first event).
 *
 * - An open training run of that id (trainGrpo/trainMcts, workflow id = run id) needs its current adapter
 *   (`state.adapterVersion` of the run's input: continue-as-new carries it every iteration), its parent, and
 *   every newer version (written since that input, or being written): all versions from `max(1, v − 1)` up.
 * - Any open workflow whose input names a version of the run needs it: an object with `runId: <run>` and an
 *   `adapterVersion` (an evaluation's modes), any `adapterVersion` of a workflow whose HaloRunId is the run
 *   (its episodes and searches), a string `<run>-v<N>` (an adapter's served name) or `…/<run>/v<N>` (its path).
 *
 * Histories that cannot be read (other than "not found") throw: retention then does nothing.
 */
export async function openRunNeeds(clients: Client | Client[], run: string): Promise<OpenRunNeeds> {
  const out: OpenRunNeeds = { versions: [], reasons: [] };
  const versions = new Set<number>();
  const esc = run.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  const named = new RegExp(`(?:^|[^A-Za-z0-9._-])${esc}-v(\\d+)(?![0-9])`, 'g');
  const path = new RegExp(`(?:^|/)${esc}/v(\\d+)(?![0-9])`, 'g');
  for (const client of Array.isArray(clients) ? clients : [clients]) {
    const ns = client.options.namespace;
    for await (const wf of client.workflow.list({ query: `ExecutionStatus = 'Running'` })) {
      let input: unknown;
      try {
        const res = await client.workflowService.getWorkflowExecutionHistory({ namespace: ns, execution: { workflowId: wf.workflowId, runId: wf.runId }, maximumPageSize: 1 });
        const payload = res.history?.events?.[0]?.workflowExecutionStartedEventAttributes?.input?.payloads?.[0];
        input = payload ? defaultPayloadConverter.fromPayload(payload) : undefined;
      } catch (err) {
        if (isNotFound(err)) continue;
        throw new Error(
          `halo gc --run ${run}: could not read the input of open workflow ${wf.workflowId} (run ${wf.runId}) in namespace ${ns}, so the versions it needs are unknown; nothing was changed: ${(err as Error).message}`,
          { cause: err },
        );
      }
      const haloRunId = wf.typedSearchAttributes?.getAll().find((p) => p.key.name === 'HaloRunId')?.value;
      const mine = new Set<number>();
      if (TRAINING_TYPES.has(wf.type) && wf.workflowId === run) {
        const v = Number((input as { state?: { adapterVersion?: unknown } } | undefined)?.state?.adapterVersion ?? 0);
        const from = Math.max(1, (Number.isFinite(v) ? v : 0) - 1);
        out.from = Math.min(out.from ?? from, from);
        out.reasons.push(`v${from} and newer: open ${wf.type} ${wf.workflowId} samples from v${v} (its parent and newer versions included)`);
      }
      const walk = (x: unknown): void => {
        if (typeof x === 'string') {
          for (const m of x.matchAll(named)) mine.add(Number(m[1]));
          for (const m of x.matchAll(path)) mine.add(Number(m[1]));
        } else if (Array.isArray(x)) x.forEach(walk);
        else if (x && typeof x === 'object') {
          const o = x as Record<string, unknown>;
          if (typeof o.adapterVersion === 'number' && (o.runId === run || haloRunId === run)) mine.add(o.adapterVersion);
          for (const y of Object.values(o)) walk(y);
        }
      };
      walk(input);
      const found = [...mine].filter((v) => Number.isInteger(v) && v >= 1).sort((a, b) => a - b);
      if (found.length > 0) out.reasons.push(`${found.map((v) => `v${v}`).join(', ')}: named by open ${wf.type} ${wf.workflowId}`);
      for (const v of found) versions.add(v);
    }
  }
  out.versions = [...versions].sort((a, b) => a - b);
  return out;
}
