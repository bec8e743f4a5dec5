import type { Client } from '@temporalio/client';
import type { Command } from 'commander';
import type { HaloConfig } from '../../lib/config/config';
import { connectClient, up } from '../stack';
import { sleep } from '../processes';
import { statusQuery } from '../../workflows/messages';
import { controlTimeoutMs, describeControl, sendRunControl } from '../run-messages';
import { reloadServedAdapters } from '../served-adapters';
import { episodesQuery, RUN_STATUSES, runsQuery } from '../visibility';
import { lastFailure, RunFailedError } from '../failure';

interface Ctx {
  loadConfig: (path?: string) => HaloConfig;
}

export interface RunRow {
  workflowId: string;
  type: string;
  status: string;
  kind?: string;
  mode?: string;
  task?: string;
  runId?: string;
  started: string;
}

const STATUSES = RUN_STATUSES;

/** Runs (training, MCTS, eval) by the search attributes their workflows set; filterable by mode and status. */
export async function listRuns(client: Client, opts: { mode?: string; status?: string; kind?: string; limit?: number }): Promise<RunRow[]> {
  return collect(client, runsQuery({ kind: opts.kind || undefined, mode: opts.mode || undefined, status: opts.status || undefined }), opts.limit ?? 100);
}

/** Episodes of a run (HaloRunId), newest first. */
export async function listEpisodes(client: Client, runId: string, limit = 500): Promise<RunRow[]> {
  return collect(client, episodesQuery(runId), limit);
}

async function collect(client: Client, query: string, limit: number): Promise<RunRow[]> {
  const rows: RunRow[] = [];
  const seen = new Set<string>();
  for await (const w of client.workflow.list({ query })) {
    // A continue-as-new chain shows one row: its newest run.
    if (seen.has(w.workflowId)) continue;
    seen.add(w.workflowId);
    const sa = w.typedSearchAttributes;
    const get = (name: string) => sa.getAll().find((p) => p.key.name === name)?.value as string | undefined;
    rows.push({
      workflowId: w.workflowId,
      type: w.type,
      status: w.status.name,
      kind: get('HaloKind'),
      mode: get('HaloMode'),
      task: get('HaloTask'),
      runId: get('HaloRunId'),
      started: w.startTime.toISOString(),
    });
    if (rows.length >= limit) break;
  }
  return rows;
}

function printTable(rows: RunRow[], cols: (keyof RunRow)[]): void {
  if (rows.length === 0) {
    console.log('(none)');
    return;
  }
  const width = cols.map((c) => Math.max(c.length, ...rows.map((r) => String(r[c] ?? '').length)));
  console.log(cols.map((c, i) => c.padEnd(width[i])).join('  '));
  for (const r of rows) console.log(cols.map((c, i) => String(r[c] ?? '').padEnd(width[i])).join('  '));
}

export function register(program: Command, ctx: Ctx): void {
  program
    .command('runs')
    .description('list runs (training, MCTS, evaluation) through their search attributes')
    .option('--mode <mode>', 'filter by mode (grpo, mcts, ...)')
    .option('--status <status>', `filter by status (${STATUSES.join(', ')})`)
    .option('--kind <kind>', 'train, mcts or eval')
    .option('--json', 'print JSON')
    .action(async (opts: { mode?: string; status?: string; kind?: string; json?: boolean }) => {
      runsQuery(opts); // a bad --kind, --mode or --status fails here, before connecting
      const cfg = ctx.loadConfig(program.opts().config);
      const { client, connection } = await connectClient(cfg);
      try {
        const rows = await listRuns(client, opts);
        if (opts.json) console.log(JSON.stringify(rows));
        else printTable(rows, ['workflowId', 'kind', 'mode', 'status', 'started']);
      } finally {
        await connection.close();
      }
    });

  program
    .command('episodes')
    .description('list the episodes of a run')
    .argument('<run>', 'run id')
    .option('--json', 'print JSON')
    .action(async (run: string, opts: { json?: boolean }) => {
      if (!/^[A-Za-z0-9._-]+$/.test(run)) throw new Error('run id must be letters, digits, . _ -');
      const cfg = ctx.loadConfig(program.opts().config);
      const { client, connection } = await connectClient(cfg);
      try {
        const rows = await listEpisodes(client, run);
        if (opts.json) console.log(JSON.stringify(rows));
        else printTable(rows, ['workflowId', 'task', 'status', 'started']);
      } finally {
        await connection.close();
      }
    });

  program
    .command('resume')
    .description('resume a run: bring the stack up (after a preemption), lift a pause, and confirm the run moves again')
    .argument('<run>', 'run id')
    .option('--timeout <s>', 'seconds to wait for progress', '300')
    .action(async (run: string, opts: { timeout: string }) => {
      const cfg = ctx.loadConfig(program.opts().config);
      const say = (m: string) => console.error(`halo: ${m}`);
      await up(cfg, say);
      const { client, connection } = await connectClient(cfg);
      try {
        await reloadServedAdapters(client, say);
        const handle = client.workflow.getHandle(run);
        const d = await handle.describe();
        if (d.status.name !== 'RUNNING') {
          console.log(`run ${run} is ${d.status.name}; nothing to resume`);
          const failure = await lastFailure(handle);
          if (failure) throw new RunFailedError(failure, `a failed run does not resume: start a new run (a new run id) once the cause is fixed`);
          return;
        }
        const paused = await handle
          .query(statusQuery)
          .then((s) => s.paused === true)
          .catch(() => false);
        if (paused) {
          // The stack is up: the run's worker answers the update with its status after the resume.
          const timeoutMs = controlTimeoutMs();
          say(`run ${run} was paused; ${describeControl(run, 'resume', await sendRunControl(connection, handle, 'resume', timeoutMs), timeoutMs)}`);
        }
        const before = d.historyLength;
        const startRun = d.runId;
        const deadline = Date.now() + Number(opts.timeout) * 1000;
        console.error(`halo: run ${run} is running; waiting for it to make progress`);
        for (;;) {
          const now = await handle.describe();
          if (now.status.name !== 'RUNNING' && now.status.name !== 'COMPLETED' && now.status.name !== 'CONTINUED_AS_NEW') {
            const failure = await lastFailure(handle);
            if (failure) throw new RunFailedError(failure);
          }
          if (now.runId !== startRun || now.historyLength > before || now.status.name !== 'RUNNING') {
            console.log(`run ${run} is moving again (${now.status.name}, history ${before} → ${now.historyLength} events)`);
            return;
          }
          if (Date.now() > deadline) throw new Error(`run ${run} made no progress in ${opts.timeout}s; see runs/logs and the Temporal UI (pending activities)`);
          await sleep(1000);
        }
      } finally {
        await connection.close();
      }
    });
}
