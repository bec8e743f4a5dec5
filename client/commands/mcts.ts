import type { Command } from 'commander';
import { WorkflowExecutionAlreadyStartedError, WorkflowIdReusePolicy, type Client, type WorkflowHandle } from '@temporalio/client';
import { join } from 'node:path';
import { type BlobStore, blobStoreFor } from '../../blob/store';
import { ConfigError, type HaloConfig } from '../../lib/config/config';
import { compositeQ, qMcts, treeStats, type Tree } from '../../lib/search/mcts';
import { describeAction, type AgentAction } from '../../lib/model-io/actions';
import { KIND, MODE, RUN_ID, TASK } from '../../lib/episode/search-attributes';
import { loadMctsSnapshot } from '../../activities/mcts-store';
import { METRICS_FILE, type TrainingMetrics } from '../../lib/training/run-metrics';
import { bestPathView, collectPairs, searchWorkflowId, type MctsSearchResult, type MctsTreeView, type SessionReuseCounters } from '../../lib/search/mcts-search';
import type { TrainingResult, TrainingStatus } from '../../workflows/train-engine';
import { REPO_ROOT } from '../processes';
import { connectClient, stackStatus } from '../stack';
import { followStatus, progressNumbers, refuseEndedBadly } from '../train';
import { addOverrideOptions, flagDefaults, overrideFlagsOf, preflightTasks, runConfigFromFlags } from '../run-flags';
import { withServedModel } from '../served-model';
import { statusQuery } from '../../workflows/messages';
import { mctsProgressQuery, mctsTreeQuery } from '../../workflows/mcts-search';
import { bestNote } from '../../lib/serving/iteration-policy';

// `halo mcts --config FILE [--detach] [--json]`: start the MCTS run `mcts.runId` (workflow `trainMcts`, id =
// run id) or attach to it, and show its progress. `halo mcts tree RUN TASK [--json]`: the tree of the task's
// current (or last) `mctsSearch` in that run.

export const MCTS_DEFAULT_CONFIG = join(REPO_ROOT, 'configs', 'mcts-default.yaml');

/** One run per run id: a second start (running or finished) attaches to the existing run. */
export async function startOrAttachMcts(client: Client, cfg: HaloConfig): Promise<{ handle: WorkflowHandle; attached: boolean }> {
  const runId = cfg.mcts.runId;
  try {
    const handle = await client.workflow.start('trainMcts', {
      taskQueue: cfg.temporal.controlTaskQueue,
      workflowId: runId,
      args: [{ config: cfg }],
      workflowIdReusePolicy: WorkflowIdReusePolicy.REJECT_DUPLICATE,
      staticSummary: `MCTS run ${runId}: ${cfg.mcts.iterations} iterations × ${cfg.mcts.tasks.length} tasks × ${cfg.mcts.numSimulations} simulations on ${cfg.episode.env}`,
      typedSearchAttributes: [
        { key: RUN_ID, value: runId },
        { key: KIND, value: 'train' },
        { key: MODE, value: 'mcts' },
        { key: TASK, value: `${cfg.episode.env}/${cfg.mcts.tasks.join(',')}`.slice(0, 200) },
      ],
    });
    return { handle, attached: false };
  } catch (err) {
    if (!(err instanceof WorkflowExecutionAlreadyStartedError)) throw err;
    const handle = client.workflow.getHandle(runId);
    await refuseEndedBadly(handle, runId, 'mcts.runId');
    return { handle, attached: true };
  }
}

function bar(done: number, total: number, width = 20): string {
  const filled = Math.round((Math.max(0, Math.min(done, total)) / Math.max(1, total)) * width);
  return `[${'#'.repeat(filled)}${'.'.repeat(width - filled)}]`;
}

const f3 = (x: number | null | undefined) => (x === null || x === undefined ? '–' : x.toFixed(3));

/** One line per finished iteration. */
export function describeIteration(iteration: number, m: TrainingMetrics): string {
  const x = m.mcts;
  if (!x) return `iteration ${iteration}: ${progressNumbers(m)}`;
  const evalSuccess = m.eval?.success_rate ?? x.eval_success_rate;
  return (
    `iteration ${iteration}: ${x.simulations} simulations, ${x.nodes} nodes, best-path success ${(m.success_rate * 100).toFixed(0)}%, ` +
    `${x.pairs} pairs (mean |ΔQ| ${f3(x.mean_abs_delta_q)}), ` +
    (x.update_skipped ? 'no update (no pairs)' : `DPO loss ${f3(m.loss)}, accuracy ${f3(x.accuracy)} → adapter v${m.adapter_version}`) +
    (x.critic_failures ? `, ${x.critic_failures}/${x.critic_calls} critic answers unusable` : '') +
    (evalSuccess !== undefined ? `, greedy eval success ${(evalSuccess * 100).toFixed(0)}%` : '')
  );
}

/** Waits for the run, printing a line whenever its progress changes, and one per finished iteration. */
export function followMcts(client: Client, handle: WorkflowHandle, say: (line: string) => void): Promise<TrainingResult> {
  let reported = 0;
  return followStatus(
    handle,
    async (st) => {
      if (st.lastMetrics && st.iteration - 1 > reported) {
        reported = st.iteration - 1;
        say(describeIteration(reported, st.lastMetrics));
      }
      const parts: string[] = [];
      for (const id of st.phase === 'search' ? (st.searches ?? []) : []) {
        const p = await client.workflow
          .getHandle(id)
          .query(mctsProgressQuery)
          .catch(() => undefined);
        if (p) parts.push(`${id.slice(id.indexOf(`-it${st.iteration}-`) + `-it${st.iteration}-`.length)} ${p.simulations}/${p.numSimulations} sims, ${p.stats.nodes} nodes`);
      }
      return `${bar(st.iteration - 1, st.iterations)} iteration ${st.iteration}/${st.iterations} · ${st.phase}${st.paused ? ' (paused)' : ''}${parts.length ? ` · ${parts.join(' · ')}` : ''} · adapter v${st.adapterVersion}`;
    },
    say,
  );
}

/**
 * The workflow id of the task's current or last search in a run: from the run's `status` query (its
 * current iteration) or, for a finished run, its result, searching back to iteration 1.
 */
export async function findSearch(client: Client, runId: string, task: string): Promise<string> {
  const run = client.workflow.getHandle(runId);
  let latest: number | undefined;
  const st = await run
    .query(statusQuery)
    .then((s) => s as TrainingStatus)
    .catch(() => undefined);
  if (st) latest = st.iteration;
  else {
    const d = await run.describe().catch((err: Error) => {
      throw new Error(`no MCTS run ${runId}: ${err.message}`);
    });
    if (d.status.name === 'COMPLETED') latest = ((await run.result()) as TrainingResult).iterations;
    else throw new Error(`run ${runId} is ${d.status.name} and no worker answered its status query`);
  }
  for (let it = latest; it >= 1; it--) {
    const id = searchWorkflowId(runId, it, task);
    if (
      await client.workflow
        .getHandle(id)
        .describe()
        .then(
          () => true,
          () => false,
        )
    )
      return id;
  }
  throw new Error(`run ${runId} has no search of task ${JSON.stringify(task)} (looked for ${searchWorkflowId(runId, latest, task)} back to iteration 1)`);
}

/** The search's tree: its `tree` query, or for a finished search without a worker, its final snapshot. */
export async function readTree(client: Client, workflowId: string, blobs: BlobStore): Promise<MctsTreeView & { status: string }> {
  const handle = client.workflow.getHandle(workflowId);
  const d = await handle.describe();
  try {
    return { ...(await handle.query(mctsTreeQuery)), status: d.status.name };
  } catch (err) {
    if (d.status.name !== 'COMPLETED') throw err;
  }
  const result = (await handle.result()) as MctsSearchResult;
  const { snapshot: snap, tree } = await loadMctsSnapshot(blobs, result.snapshotRef);
  const alpha = snap.alpha;
  return {
    status: d.status.name,
    workflowId,
    phase: 'done',
    simulations: snap.simulations,
    numSimulations: snap.simulations,
    stats: treeStats(tree),
    runs: result.runs,
    runId: snap.runId,
    iteration: snap.iteration,
    task: result.task,
    goal: snap.goal,
    alpha,
    pairThreshold: snap.pairThreshold,
    tree,
    bestPath: bestPathView(tree, alpha),
    pairs: result.pairs.count,
    counters: snap.counters,
  };
}

/** How parked sessions served the restores; empty for searches without them (or from before they existed). */
function reuseNote(r: SessionReuseCounters | undefined): string {
  if (!r || r.reused + r.advanced + r.resetInPlace === 0) return '';
  return `; ${r.reused} at the node, ${r.advanced} stepped forward, ${r.resetInPlace} reset in place, ${r.fresh} new sessions`;
}

/** Text rendering: a header and one line per node, children under their parent (★ marks the best path). */
export function renderTree(view: MctsTreeView & { status?: string }, maxNodes = 300): string {
  const lines: string[] = [];
  lines.push(
    `${view.workflowId}${view.status ? ` (${view.status})` : ''} · ${view.task.env}/${view.task.task} seed ${view.task.seed} · ` +
      `${view.simulations}/${view.numSimulations} simulations · ${view.stats.nodes} nodes, depth ${view.stats.maxDepth}, ${view.stats.terminalNodes} terminal · ${view.pairs} DPO pairs`,
  );
  if (view.goal) lines.push(`goal: ${view.goal}`);
  if (view.bestPath) lines.push(`best path: ${view.bestPath.actions.join(' → ') || '(none)'}${view.bestPath.success ? ' (success)' : ''}`);
  if (view.counters) {
    const c = view.counters;
    lines.push(
      `candidates ${c.candidates} (${c.invalidCandidates} unparseable) · critic ${c.criticCalls} calls, ${c.criticFailures} unusable · ` +
        `${c.restores} restores (${c.replayedActions} actions replayed${reuseNote(c.sessionReuse)}), ${c.sessionRebuilds} session rebuilds`,
    );
  }
  if (view.treeNote) lines.push(`note: ${view.treeNote}`);
  const tree: Tree | null = view.tree;
  if (!tree) {
    lines.push(`(${view.phase})`);
    return lines.join('\n');
  }
  const best = new Set(view.bestPath?.nodeIds ?? []);
  let count = 0;
  const walk = (id: number, prefix: string, last: boolean, isRoot: boolean) => {
    if (count >= maxNodes) return;
    count++;
    const n = tree.nodes[id];
    const { outcome } = n.data;
    const what = n.action ? describeAction(n.action as AgentAction) : 'root';
    const stats =
      `N=${n.visits} Q=${compositeQ(n, view.alpha).toFixed(3)} Q̃=${qMcts(n).toFixed(3)} prior=${n.prior.toFixed(2)}` +
      (n.criticValue !== null ? ` critic=${n.criticValue.toFixed(2)}` : '') +
      (n.terminal ? ` terminal r=${n.reward}${outcome ? ` (${outcome})` : ''}` : '');
    const head = isRoot ? '' : `${prefix}${last ? '└─ ' : '├─ '}`;
    lines.push(`${head}${best.has(id) ? '★ ' : ''}[${id}] ${what}  ${stats}`);
    const kids = n.children;
    kids.forEach((k, i) => walk(k, isRoot ? '' : `${prefix}${last ? '   ' : '│  '}`, i === kids.length - 1, false));
  };
  walk(0, '', true, true);
  if (count >= maxNodes && tree.nodes.length > maxNodes) lines.push(`… ${tree.nodes.length - maxNodes} more nodes (--json for all)`);
  return lines.join('\n');
}

export function register(program: Command, ctx: { loadConfig(path?: string): HaloConfig }): void {
  const mcts = program
    .command('mcts')
    .description('start an Agent-Q-style MCTS + step-level DPO run (or attach to it if the run id exists) and show its progress')
    .option('--config <file>', 'config file (YAML); default configs/mcts-default.yaml')
    .option('--run-id <id>', 'run id (default: mcts.runId of the config)')
    .option('--detach', 'return as soon as the run is started')
    .option('--json', 'print the final result as JSON');
  addOverrideOptions(mcts, 'mcts', () => ({ file: 'configs/mcts-default.yaml', values: flagDefaults('mcts', ctx.loadConfig(MCTS_DEFAULT_CONFIG)) }));
  mcts.action(async (_opts: unknown, cmd: Command) => {
    const opts = cmd.optsWithGlobals<{ config?: string; runId?: string; detach?: boolean; json?: boolean; taskRegistry?: string } & Record<string, unknown>>();
    const fromFlags = runConfigFromFlags('mcts', opts.config, MCTS_DEFAULT_CONFIG, opts);
    const { notes, pin } = fromFlags;
    const cfg = typeof opts.policyUrl === 'string' ? await withServedModel(fromFlags.cfg, { configGiven: opts.config !== undefined, notes }) : fromFlags.cfg;
    for (const n of notes) if (!opts.json) console.error(`halo: ${n}`);
    await preflightTasks(cfg.episode.env, cfg.mcts.tasks, pin, `MCTS run ${cfg.mcts.runId}`);
    const runId = cfg.mcts.runId;
    const { client, connection } = await connectClient(cfg);
    try {
      const { handle, attached } = await startOrAttachMcts(client, cfg);
      console.error(`halo: ${attached ? 'attached to' : 'started'} MCTS run ${runId} (workflow id ${runId}, queue ${cfg.temporal.controlTaskQueue})`);
      if (attached && Object.keys(overrideFlagsOf(opts)).length) {
        console.error(`halo: run ${runId} already exists and keeps the config it started with; for these flags start a new run (--run-id NEW)`);
      }
      if (opts.detach) {
        if (opts.json) console.log(JSON.stringify({ runId, attached }));
        return;
      }
      const result = await followMcts(client, handle, (line) => !opts.json && console.error(line));
      const st = stackStatus(cfg);
      const where = { metrics: join(st.home, runId, METRICS_FILE), adapters: join(REPO_ROOT, 'checkpoints', runId), ui: st.uiUrl };
      if (opts.json) console.log(JSON.stringify({ ...result, ...where }));
      else {
        console.log(`MCTS run ${result.runId} finished: ${result.iterations} iterations, adapter v${result.adapterVersion}${result.stoppedEarly ? ' (stopped early)' : ''}`);
        const best = bestNote(result);
        if (best) console.log(best);
        console.log(`metrics:  ${where.metrics}\nadapters: ${where.adapters}`);
        console.log(`trees:    npx halo mcts tree ${runId} <task>`);
      }
    } finally {
      await connection.close();
    }
  });

  mcts
    .command('tree')
    .description("the search tree of a task's current (or last) mctsSearch in a run")
    .argument('<run>', 'run id (mcts.runId)')
    .argument('<task>', 'task name, e.g. click-button')
    .option('--json', 'print the tree (nodes, per-node data, statistics) as JSON')
    .option('--max-nodes <n>', 'nodes shown in the text view', '300')
    .action(async (run: string, task: string, _opts: unknown, cmd: Command) => {
      const opts = cmd.optsWithGlobals<{ config?: string; json?: boolean; maxNodes?: string }>();
      const maxNodes = Number(opts.maxNodes ?? 300);
      if (!Number.isInteger(maxNodes) || maxNodes < 1) throw new ConfigError(`--max-nodes must be a positive integer, got ${JSON.stringify(opts.maxNodes)}`);
      const cfg = ctx.loadConfig(opts.config ?? MCTS_DEFAULT_CONFIG);
      const { client, connection } = await connectClient(cfg);
      try {
        const id = await findSearch(client, run, task);
        const view = await readTree(client, id, blobStoreFor(stackStatus(cfg).home));
        if (opts.json) {
          const pairs = view.tree ? collectPairs(view.tree, view.alpha, view.pairThreshold) : [];
          console.log(JSON.stringify({ ...view, pairList: pairs }));
        } else console.log(renderTree(view, maxNodes));
      } finally {
        await connection.close();
      }
    });
}
