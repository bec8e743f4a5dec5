import { spawnSync } from 'node:child_process';
import type { Client } from '@temporalio/client';
import type { Command } from 'commander';
import type { HaloConfig } from '../../lib/config';
import { blobStoreFor } from '../../blob/store';
import { collectBlobGarbage, DEFAULT_GC_GRACE_MS, formatBytes, type GcReport } from '../../host/blob-gc';
import { learnerCommand } from '../processes';
import { connectClient, stackStatus } from '../stack';

/**
 * `halo gc`: mark and sweep over the blob store. Live blobs are those named by a workflow history the server
 * still keeps (running or closed: runs, evaluations, episodes, searches), by a text file under the home folder
 * (metrics rows, eval records, snapshots, ledgers), or by a live text blob (trajectories → screenshots, batches
 * → prompts, eval records → trajectories); the rest goes once older than the grace period (`host/blob-gc.ts`).
 *
 * `halo gc --run <id>`: adapter retention for one run's checkpoints, by the learner's own rules
 * (workers/learner/halo_learner/retention.py): the last K versions whole, older ones without optimiser state,
 * with --delete older ones removed unless they are milestones (every --keep-every) or named with --need.
 */
export function register(program: Command, ctx: { loadConfig: (path?: string) => HaloConfig }): void {
  program
    .command('gc')
    .description("remove blobs nothing references (mark and sweep); with --run, prune that run's adapter versions instead")
    .option('--dry-run', 'print what would go, change nothing')
    .option('--grace <minutes>', 'keep unreferenced blobs younger than this (writes not yet recorded)', String(DEFAULT_GC_GRACE_MS / 60_000))
    .option('--json', 'print the report as JSON')
    .option('--run <id>', 'adapter retention for this run (checkpoints/<id>/v<N>) instead of the blob store')
    .option('--keep-last <k>', 'with --run: versions kept whole', '3')
    .option('--keep-every <n>', 'with --run --delete: keep every n-th version (weights only)', '10')
    .option('--need <version...>', 'with --run: versions never touched (the running run, an evaluation, a served adapter)')
    .option('--delete', 'with --run: delete old versions, not only their optimiser state')
    .action(async (opts: { run?: string; keepLast: string; keepEvery: string; need?: string[]; delete?: boolean; dryRun?: boolean; grace: string; json?: boolean }) => {
      if (opts.run) {
        const { command, env } = learnerCommand();
        const args = ['-m', 'halo_learner.retention', '--run', opts.run, '--keep-last', opts.keepLast, '--keep-every', opts.keepEvery];
        for (const v of opts.need ?? []) args.push('--need', v);
        if (opts.delete) args.push('--delete');
        if (opts.dryRun) args.push('--dry-run');
        const r = spawnSync(command, args, { env, stdio: 'inherit' });
        if (r.error) throw r.error;
        if (r.status !== 0) process.exitCode = r.status ?? 1;
        return;
      }
      const graceMin = Number(opts.grace);
      if (!Number.isFinite(graceMin) || graceMin < 0) throw new Error(`--grace ${opts.grace}: minutes, 0 or more`);
      const cfg = ctx.loadConfig(program.opts().config);
      const { client, connection } = await connectClient(cfg);
      try {
        const report = await gcBlobs(cfg, client, { dryRun: Boolean(opts.dryRun), graceMs: graceMin * 60_000 });
        if (opts.json) console.log(JSON.stringify({ ...report, removedRefs: undefined }));
        else console.log(describeGc(report));
      } finally {
        await connection.close();
      }
    });
}

/** The text of every workflow history the namespace still keeps (payloads decoded), one history at a time. */
export async function* historyTexts(client: Client, query?: string): AsyncGenerator<string> {
  for await (const wf of client.workflow.list(query ? { query } : undefined)) {
    const history = await client.workflow.getHandle(wf.workflowId, wf.runId).fetchHistory().catch(() => undefined);
    if (!history) continue;
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

/**
 * Mark (histories, the home folder's text files, live text blobs) and sweep of the blob store: the folder
 * `<home>/blobs`, or with `HALO_STORE=s3://bucket/prefix` the keys under `<prefix>/blobs/` (nothing else in
 * the bucket is listed or deleted).
 */
export async function gcBlobs(cfg: HaloConfig, client: Client, o: { dryRun: boolean; graceMs?: number; home?: string }): Promise<GcReport> {
  const home = o.home ?? stackStatus(cfg).home;
  return collectBlobGarbage({
    store: blobStoreFor(home),
    rootPaths: [home],
    rootTexts: historyTexts(client),
    graceMs: o.graceMs,
    dryRun: o.dryRun,
  });
}

export function describeGc(r: GcReport): string {
  const verb = r.dryRun ? 'would free' : 'freed';
  return [
    `blob store ${r.where}: ${r.blobs} blobs, ${formatBytes(r.bytes)}; live ${r.live} (${formatBytes(r.liveBytes)}); kept as too recent ${r.young}`,
    `${r.dryRun ? 'would remove' : 'removed'} ${r.removed} blobs and ${r.tempFilesRemoved} abandoned temp files: ${verb} ${formatBytes(r.bytesFreed)}` +
      (r.missing ? ` (${r.missing} referenced blobs were already missing)` : ''),
  ].join('\n');
}

