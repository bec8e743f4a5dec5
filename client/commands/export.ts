import type { Client } from '@temporalio/client';
import { defaultPayloadConverter } from '@temporalio/common';
import type { Command } from 'commander';
import { mkdir, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { loadMctsSnapshot } from '../../activities/mcts-store';
import { blobStoreFor, type BlobStore } from '../../blob/store';
import type { HaloConfig } from '../../lib/config/config';
import type { EpisodeInput, EpisodeResult } from '../../lib/episode/episode-types';
import { compositeQ, qMcts, type TreeStats } from '../../lib/search/mcts';
import type { MctsPair } from '../../lib/training/experience';
import type { BestPathView, MctsCounters, MctsSearchResult } from '../../lib/search/mcts-search';
import type { MctsSearchInput } from '../../workflows/mcts-search';
import { REPO_ROOT } from '../processes';
import { connectClient } from '../stack';
import { listEpisodes, type RunRow } from './runs';
import { completionText, loadTrajectory, safeFileName } from './view';

// `halo export RUN`: one JSONL file per episode, `<mode>/<run>/<task>__attempt_<i>.jsonl`, read from the durable
// store (Temporal visibility finds the run's episodes, their results name the trajectory blobs). The first record
// is the episode's provenance, then one record per step. An MCTS run's searches (HaloKind 'mcts') go to
// `mcts/<run>/searches.jsonl` (one record per search), `mcts/<run>/trees/<task>__it<i>.jsonl` (the search's
// record, then one record per tree node) and `mcts/<run>/dpo-pairs.jsonl` (one record per step-level DPO pair),
// read from each finished search's result and the tree snapshot and pair blobs it names. For reading and
// sharing; training stays online.

export interface ProvenanceRecord {
  type: 'provenance';
  run: string;
  workflowId: string;
  mode: string;
  env: string;
  task: string;
  seed: number;
  attempt: number;
  temperature: number | null;
  /** The model name the policy was sampled from (a served adapter's name, `<run>-v<N>`, for vLLM). */
  model: string | null;
  policyBackend: string | null;
  /** The adapter version sampled from (0: the base model); null when the input does not say. */
  adapterVersion: number | null;
  adapter: { name: string; path: string } | null;
  /** First 16 hex digits of the sha256 of the run's stored config (null for runs that store none). */
  configHash: string | null;
  goal: string;
  success: boolean;
  reward: number;
  steps: number;
  reason: string | null;
  trajectoryRef: string;
}

export interface StepExportRecord {
  type: 'step';
  step: number;
  url: string;
  action: unknown;
  valid: boolean;
  /** The model's whole output for this step, and the sampler's tokens of it (a `SampledTokens` blob; null: none). */
  modelText: string;
  tokensRef: string | null;
  /** The environment's own reward, and the shaped reward with the terms that fired. */
  reward: number;
  rewardBreakdown: unknown;
  done: boolean;
  actionError: string | null;
  /** The screenshot the action was taken in: its blob reference and where its bytes are. */
  screenshotRef: string;
  screenshot: string;
  axtreeRef: string;
  promptRef: string;
}

/** One MCTS search (`mctsSearch` workflow): the provenance of its tree nodes and DPO pairs. */
export interface MctsSearchExportRecord {
  type: 'search';
  run: string;
  /** The search's workflow id (`<run>-it<i>-<task>` in a training run). */
  searchWorkflowId: string;
  /** The training iteration (null for a test-time search inside an episode). */
  iteration: number | null;
  env: string;
  task: string;
  seed: number;
  goal: string;
  /** The policy the search sampled from: its model name, backend, adapter version (0: the base model) and served adapter. */
  model: string | null;
  policyBackend: string | null;
  adapterVersion: number | null;
  adapter: { name: string; path: string } | null;
  temperature: number | null;
  configHash: string | null;
  simulations: number;
  /** Workflow runs of the search's continue-as-new chain. */
  runs: number;
  stats: TreeStats;
  bestPath: BestPathView;
  alpha: number;
  pairThreshold: number;
  /** DPO pairs of the search, and the blob holding them (null: none). */
  pairs: number;
  pairsRef: string | null;
  /** The final tree (manifest blob; its nodes are in the chunk blobs it names). */
  snapshotRef: string;
  counters: MctsCounters;
}

/** Where a search's node or pair came from: the run, the iteration, the search, the adapter version it sampled. */
interface SearchProvenance {
  run: string;
  iteration: number | null;
  searchWorkflowId: string;
  adapterVersion: number | null;
}

export interface MctsNodeExportRecord extends SearchProvenance {
  type: 'node';
  nodeId: number;
  parent: number | null;
  children: number[];
  depth: number;
  /** The action from the parent's state (null at the root). */
  action: unknown;
  visits: number;
  /** Composite `α·Q_mcts + (1-α)·Q_critic`, and its parts. */
  q: number;
  qMcts: number;
  criticValue: number | null;
  prior: number;
  terminal: boolean;
  reward: number | null;
  /** Why the node is terminal (success, failure, unparseable, depth cap, …). */
  outcome: string | null;
  actionError: string | null;
  onBestPath: boolean;
  /** The completion that proposed the action, the prompt at this state (its children's), and the sampler's log-prob. */
  completionRef: string | null;
  preview: string | null;
  refLogprob: number | null;
  /** The sampler's tokens of that completion (a `SampledTokens` blob), when the search kept them. */
  tokensRef: string | null;
  promptRef: string | null;
  /** The state after the action, once run: URL and blob references (the screenshot's file or s3:// location too). */
  url: string | null;
  screenshotRef: string | null;
  screenshot: string | null;
  axtreeRef: string | null;
}

export interface MctsPairExportRecord extends SearchProvenance {
  type: 'dpo_pair';
  /** The search's pair blob and tree snapshot the pair was read from. */
  pairsRef: string;
  snapshotRef: string;
  parentNodeId: number;
  chosenNodeId: number;
  rejectedNodeId: number;
  promptRef: string;
  chosenRef: string;
  rejectedRef: string;
  /** The sampler's tokens of the two completions (`SampledTokens` blobs); null when the search did not keep them. */
  chosenTokensRef: string | null;
  rejectedTokensRef: string | null;
  /** The completions' text (null when a blob is gone). */
  chosenText: string | null;
  rejectedText: string | null;
  chosenQ: number;
  rejectedQ: number;
  deltaQ: number;
  refChosenLogprob: number | null;
  refRejectedLogprob: number | null;
}

export interface ExportResult {
  out: string;
  files: string[];
  skipped: { workflowId: string; reason: string }[];
  /** Episodes and MCTS searches written. */
  episodes: number;
  searches: number;
}

/** The first event's input of a workflow's run (the latest run when `runId` is absent). */
async function workflowInput<T>(
  client: Client,
  workflowId: string,
  runId?: string,
): Promise<{ input: T | undefined; events: Awaited<ReturnType<ReturnType<Client['workflow']['getHandle']>['fetchHistory']>>['events'] }> {
  const history = await client.workflow.getHandle(workflowId, runId).fetchHistory();
  const payload = history.events?.[0]?.workflowExecutionStartedEventAttributes?.input?.payloads?.[0];
  return { input: payload ? (defaultPayloadConverter.fromPayload(payload) as T) : undefined, events: history.events };
}

/**
 * The run's config hash: the latest run of a continue-as-new chain carries it in its state; a chain of one run
 * has it only as the result of its `storeJson` activity.
 */
async function runConfigHash(client: Client, run: string): Promise<string | null> {
  try {
    const { input, events } = await workflowInput<{ state?: { configHash?: string } }>(client, run);
    if (input?.state?.configHash) return input.state.configHash;
    const scheduled = new Set((events ?? []).filter((e) => e.activityTaskScheduledEventAttributes?.activityType?.name === 'storeJson').map((e) => String(e.eventId)));
    for (const e of events ?? []) {
      const done = e.activityTaskCompletedEventAttributes;
      if (!done || !scheduled.has(String(done.scheduledEventId))) continue;
      const p = done.result?.payloads?.[0];
      const r = p ? (defaultPayloadConverter.fromPayload(p) as { hash?: string }) : undefined;
      if (r?.hash) return r.hash;
    }
  } catch {
    /* an episode started on its own has no run workflow */
  }
  return null;
}

/** Colocated: the input's version; vLLM: the version in the served adapter's name (`<run>-v<N>`), 0 for the base model. */
function adapterVersionOf(input: Pick<EpisodeInput, 'adapter' | 'policy' | 'adapterVersion'> | undefined, run: string): number | null {
  if (!input) return null;
  const name = input.adapter?.lora_name ?? input.policy?.model ?? '';
  const m = new RegExp(`^${run.replace(/[.]/g, '\\.')}-v(\\d+)$`).exec(name);
  if (m) return Number(m[1]);
  return input.adapterVersion ?? null;
}

export async function exportRun(client: Client, blobs: BlobStore, run: string, out: string): Promise<ExportResult> {
  const rows = await listEpisodes(client, run, 100_000);
  const searches = await listSearches(client, run);
  if (rows.length === 0 && searches.length === 0) {
    throw new Error(`run ${run} has no episodes and no MCTS searches (search attribute HaloRunId = '${run}' AND HaloKind IN ('episode', 'mcts'))`);
  }
  const configHash = await runConfigHash(client, run);
  const taskName = (r: RunRow) => (r.task ?? '').split('/').slice(1).join('/') || r.task || 'task';
  // Attempts per task in start order (ties by workflow id, which numbers iteration and episode).
  const ordered = [...rows].sort((a, b) => a.started.localeCompare(b.started) || a.workflowId.localeCompare(b.workflowId, undefined, { numeric: true }));
  const attempts = new Map<string, number>();
  const files: string[] = [];
  const skipped: ExportResult['skipped'] = [];
  for (const row of ordered) {
    if (row.status !== 'COMPLETED') {
      skipped.push({ workflowId: row.workflowId, reason: `episode is ${row.status.toLowerCase()}: no trajectory` });
      continue;
    }
    const key = `${row.mode ?? 'episode'}\0${taskName(row)}`;
    const attempt = attempts.get(key) ?? 0;
    attempts.set(key, attempt + 1);
    const handle = client.workflow.getHandle(row.workflowId);
    const result = (await handle.result()) as EpisodeResult;
    const { input } = await workflowInput<EpisodeInput>(client, row.workflowId);
    const t = await loadTrajectory(result.trajectoryRef, blobs);
    const mode = row.mode ?? input?.mode ?? 'episode';
    const prov: ProvenanceRecord = {
      type: 'provenance',
      run,
      workflowId: row.workflowId,
      mode,
      env: t.task.env,
      task: t.task.task,
      seed: t.task.seed,
      attempt,
      temperature: input?.policy?.temperature ?? null,
      model: input?.policy?.model ?? t.policyModel ?? null,
      policyBackend: input?.policy?.backend ?? null,
      adapterVersion: adapterVersionOf(input, run),
      adapter: input?.adapter ? { name: input.adapter.lora_name, path: input.adapter.lora_path } : null,
      configHash,
      goal: t.goal,
      success: t.success,
      reward: t.reward,
      steps: t.steps.length,
      reason: t.reason,
      trajectoryRef: result.trajectoryRef,
    };
    const lines: string[] = [JSON.stringify(prov)];
    for (const s of t.steps) {
      const rec: StepExportRecord = {
        type: 'step',
        step: s.step,
        url: s.observation.url,
        action: s.completion.action,
        valid: s.completion.valid,
        modelText: await completionText(s.completion, async (ref) => (await textOf(blobs, ref)) ?? undefined),
        tokensRef: s.completion.tokensRef ?? null,
        reward: s.reward,
        rewardBreakdown: s.shaped,
        done: s.done,
        actionError: s.actionError ?? null,
        screenshotRef: s.observation.screenshotRef,
        screenshot: blobs.locationOf(s.observation.screenshotRef),
        axtreeRef: s.observation.axtreeRef,
        promptRef: s.promptRef,
      };
      lines.push(JSON.stringify(rec));
    }
    const dir = join(out, safeFileName(mode), safeFileName(run));
    await mkdir(dir, { recursive: true });
    const file = join(dir, `${safeFileName(t.task.task)}__attempt_${attempt}.jsonl`);
    await writeFile(file, lines.join('\n') + '\n');
    files.push(file);
  }
  const episodes = files.length;
  const mcts = await exportSearches(client, blobs, run, out, searches, configHash);
  files.push(...mcts.files);
  skipped.push(...mcts.skipped);
  return { out, files, skipped, episodes, searches: mcts.searches };
}

const RUN_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$/;

/** The run's MCTS searches (one row per workflow id, the status of its chain's latest run). */
async function listSearches(client: Client, run: string): Promise<{ workflowId: string; status: string }[]> {
  if (!RUN_ID.test(run)) throw new Error(`run id must be letters, digits, . _ - (got ${JSON.stringify(run)})`);
  const ids = new Set<string>();
  for await (const w of client.workflow.list({ query: `HaloRunId = '${run}' AND HaloKind = 'mcts'` })) ids.add(w.workflowId);
  const out: { workflowId: string; status: string }[] = [];
  for (const workflowId of ids) out.push({ workflowId, status: (await client.workflow.getHandle(workflowId).describe()).status.name });
  return out;
}

async function textOf(blobs: BlobStore, ref: string): Promise<string | null> {
  try {
    return (await blobs.get(ref)).toString('utf8');
  } catch {
    return null;
  }
}

/**
 * The finished searches of a run: `mcts/<run>/searches.jsonl`, one tree file per search and `dpo-pairs.jsonl`. Each
 * search's input (the latest run of its continue-as-new chain carries it whole) gives the policy it sampled from, its
 * result the final tree snapshot and the pair blob.
 */
async function exportSearches(
  client: Client,
  blobs: BlobStore,
  run: string,
  out: string,
  rows: { workflowId: string; status: string }[],
  configHash: string | null,
): Promise<{ files: string[]; skipped: ExportResult['skipped']; searches: number }> {
  const skipped: ExportResult['skipped'] = [];
  const done: { record: MctsSearchExportRecord; nodes: MctsNodeExportRecord[]; pairs: MctsPairExportRecord[] }[] = [];
  for (const row of rows) {
    if (row.status !== 'COMPLETED') {
      skipped.push({ workflowId: row.workflowId, reason: `search is ${row.status.toLowerCase()}: no final tree` });
      continue;
    }
    const result = (await client.workflow.getHandle(row.workflowId).result()) as MctsSearchResult;
    const { input } = await workflowInput<MctsSearchInput>(client, row.workflowId);
    const { snapshot, tree } = await loadMctsSnapshot(blobs, result.snapshotRef);
    const prov: SearchProvenance = {
      run,
      iteration: input?.iteration ?? snapshot.iteration ?? null,
      searchWorkflowId: row.workflowId,
      adapterVersion: adapterVersionOf(input, run),
    };
    const record: MctsSearchExportRecord = {
      type: 'search',
      run,
      searchWorkflowId: row.workflowId,
      iteration: prov.iteration,
      env: result.task.env,
      task: result.task.task,
      seed: result.task.seed,
      goal: result.goal,
      model: input?.policy?.model ?? null,
      policyBackend: input?.policy?.backend ?? null,
      adapterVersion: prov.adapterVersion,
      adapter: input?.adapter ? { name: input.adapter.lora_name, path: input.adapter.lora_path } : null,
      temperature: input?.params?.temperature ?? null,
      configHash,
      simulations: result.simulations,
      runs: result.runs,
      stats: result.stats,
      bestPath: result.bestPath,
      alpha: snapshot.alpha,
      pairThreshold: snapshot.pairThreshold,
      pairs: result.pairs.count,
      pairsRef: result.pairs.ref,
      snapshotRef: result.snapshotRef,
      counters: result.counters,
    };
    const best = new Set(result.bestPath.nodeIds);
    const nodes = tree.nodes.map((n): MctsNodeExportRecord => {
      const o = n.observationRef;
      return {
        type: 'node',
        ...prov,
        nodeId: n.id,
        parent: n.parent,
        children: n.children,
        depth: n.depth,
        action: n.action,
        visits: n.visits,
        q: compositeQ(n, snapshot.alpha),
        qMcts: qMcts(n),
        criticValue: n.criticValue,
        prior: n.prior,
        terminal: n.terminal,
        reward: n.reward,
        outcome: n.data.outcome ?? null,
        actionError: n.data.actionError ?? null,
        onBestPath: n.id === 0 || best.has(n.id),
        completionRef: n.data.completion?.ref ?? null,
        preview: n.data.completion?.preview ?? null,
        refLogprob: n.data.refLogprob ?? null,
        tokensRef: n.data.completion?.tokensRef ?? null,
        promptRef: n.data.promptRef ?? null,
        url: o?.url ?? null,
        screenshotRef: o?.screenshotRef ?? null,
        screenshot: o?.screenshotRef ? blobs.locationOf(o.screenshotRef) : null,
        axtreeRef: o?.axtreeRef ?? null,
      };
    });
    const pairs: MctsPairExportRecord[] = [];
    if (result.pairs.ref) {
      for (const p of await blobs.getJson<MctsPair[]>(result.pairs.ref)) {
        pairs.push({
          type: 'dpo_pair',
          ...prov,
          pairsRef: result.pairs.ref,
          snapshotRef: result.snapshotRef,
          parentNodeId: p.parent,
          chosenNodeId: p.chosen,
          rejectedNodeId: p.rejected,
          promptRef: p.prompt_ref,
          chosenRef: p.chosen_ref,
          rejectedRef: p.rejected_ref,
          chosenTokensRef: p.chosen_tokens_ref ?? null,
          rejectedTokensRef: p.rejected_tokens_ref ?? null,
          chosenText: await textOf(blobs, p.chosen_ref),
          rejectedText: await textOf(blobs, p.rejected_ref),
          chosenQ: p.chosen_q,
          rejectedQ: p.rejected_q,
          deltaQ: p.delta_q,
          refChosenLogprob: p.ref_chosen_logprob,
          refRejectedLogprob: p.ref_rejected_logprob,
        });
      }
    }
    done.push({ record, nodes, pairs });
  }
  if (done.length === 0) return { files: [], skipped, searches: 0 };
  // Iteration, then task, then workflow id: the same order on every export.
  done.sort(
    (a, b) =>
      (a.record.iteration ?? 0) - (b.record.iteration ?? 0) || a.record.task.localeCompare(b.record.task) || a.record.searchWorkflowId.localeCompare(b.record.searchWorkflowId),
  );
  const dir = join(out, 'mcts', safeFileName(run));
  await mkdir(join(dir, 'trees'), { recursive: true });
  const jsonl = (records: unknown[]) => records.map((r) => JSON.stringify(r) + '\n').join('');
  const files: string[] = [];
  const searchesFile = join(dir, 'searches.jsonl');
  await writeFile(searchesFile, jsonl(done.map((d) => d.record)));
  files.push(searchesFile);
  for (const d of done) {
    const name = d.record.iteration !== null ? `${safeFileName(d.record.task)}__it${d.record.iteration}` : safeFileName(d.record.searchWorkflowId);
    const file = join(dir, 'trees', `${name}.jsonl`);
    await writeFile(file, jsonl([d.record, ...d.nodes]));
    files.push(file);
  }
  const pairsFile = join(dir, 'dpo-pairs.jsonl');
  await writeFile(pairsFile, jsonl(done.flatMap((d) => d.pairs)));
  files.push(pairsFile);
  return { files, skipped, searches: done.length };
}

export function register(program: Command, ctx: { loadConfig: (path?: string) => HaloConfig }): void {
  program
    .command('export')
    .description(
      "write one JSONL file per episode of a run, <mode>/<run>/<task>__attempt_<i>.jsonl: a provenance record, then one record per step; an MCTS run's searches, trees and DPO pairs under mcts/<run>/",
    )
    .argument('<run>', 'run id')
    .option('--out <dir>', 'output folder (default <stack.home>/exports)')
    .option('--json', 'print the written files as JSON')
    .action(async (run: string, opts: { out?: string; json?: boolean }) => {
      if (!/^[A-Za-z0-9._-]+$/.test(run)) throw new Error('run id must be letters, digits, . _ -');
      const cfg = ctx.loadConfig(program.opts().config);
      const home = resolve(REPO_ROOT, cfg.stack.home);
      const out = resolve(opts.out ?? join(home, 'exports'));
      const { client, connection } = await connectClient(cfg);
      try {
        const res = await exportRun(client, blobStoreFor(home), run, out);
        if (opts.json) console.log(JSON.stringify(res));
        else {
          for (const f of res.files) console.log(f);
          const searches = res.searches ? `, ${res.searches} MCTS search(es) (searches, trees, DPO pairs)` : '';
          console.error(`halo: ${res.episodes} episode(s)${searches} of run ${run} written under ${out}${res.skipped.length ? `; ${res.skipped.length} unfinished skipped` : ''}`);
        }
      } finally {
        await connection.close();
      }
    });
}
