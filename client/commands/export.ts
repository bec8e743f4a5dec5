import type { Client } from '@temporalio/client';
import { defaultPayloadConverter } from '@temporalio/common';
import type { Command } from 'commander';
import { mkdir, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { blobStoreFor, type BlobStore } from '../../blob/store';
import type { HaloConfig } from '../../lib/config';
import type { EpisodeInput, EpisodeResult } from '../../lib/episode-types';
import { REPO_ROOT } from '../processes';
import { connectClient } from '../stack';
import { listEpisodes, type RunRow } from './runs';
import { loadTrajectory, safeFileName } from './view';

// `halo export RUN`: one JSONL file per episode, `<mode>/<run>/<task>__attempt_<i>.jsonl`, read from the durable
// store (Temporal visibility finds the run's episodes, their results name the trajectory blobs). The first record
// is the episode's provenance, then one record per step. For reading and sharing; training stays online.

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
  /** The model's whole output for this step. */
  modelText: string;
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

export interface ExportResult {
  out: string;
  files: string[];
  skipped: { workflowId: string; reason: string }[];
}

/** The first event's input of a workflow's run (the latest run when `runId` is absent). */
async function workflowInput<T>(client: Client, workflowId: string, runId?: string): Promise<{ input: T | undefined; events: Awaited<ReturnType<ReturnType<Client['workflow']['getHandle']>['fetchHistory']>>['events'] }> {
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
    const scheduled = new Set(
      (events ?? []).filter((e) => e.activityTaskScheduledEventAttributes?.activityType?.name === 'storeJson').map((e) => String(e.eventId)),
    );
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
function adapterVersionOf(input: EpisodeInput | undefined, run: string): number | null {
  if (!input) return null;
  const name = input.adapter?.lora_name ?? input.policy?.model ?? '';
  const m = new RegExp(`^${run.replace(/[.]/g, '\\.')}-v(\\d+)$`).exec(name);
  if (m) return Number(m[1]);
  return input.adapterVersion ?? null;
}

export async function exportRun(client: Client, blobs: BlobStore, run: string, out: string): Promise<ExportResult> {
  const rows = await listEpisodes(client, run, 100_000);
  if (rows.length === 0) throw new Error(`run ${run} has no episodes (search attribute HaloRunId = '${run}' AND HaloKind = 'episode')`);
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
        action: s.action,
        valid: s.valid,
        modelText: s.completion,
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
  return { out, files, skipped };
}

export function register(program: Command, ctx: { loadConfig: (path?: string) => HaloConfig }): void {
  program
    .command('export')
    .description('write one JSONL file per episode of a run, <mode>/<run>/<task>__attempt_<i>.jsonl: a provenance record, then one record per step')
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
          console.error(`halo: ${res.files.length} episode(s) of run ${run} written under ${out}${res.skipped.length ? `; ${res.skipped.length} without a trajectory skipped` : ''}`);
        }
      } finally {
        await connection.close();
      }
    });
}
