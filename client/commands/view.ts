import type { Command } from 'commander';
import { existsSync } from 'node:fs';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { basename, dirname, join, resolve } from 'node:path';
import { BlobNotFoundError, BlobStore, blobStoreFor } from '../../blob/store';
import type { HaloConfig } from '../../lib/config/config';
import type { EpisodeResult } from '../../lib/episode/episode-types';
import { BLOB_REF, type Completion, type Trajectory, type TrajectoryObservation, type TrajectoryStep } from '../../lib/training/experience';
import { readTrajectory } from '../../lib/training/stored-trajectory';
import { describeZodError } from '../../lib/training/learner-types';
import { pngSize } from '../../host/png';
import { REPO_ROOT } from '../processes';
import { connectClient } from '../stack';
import { planOverlay, renderEpisodeHtml, type CandidateView, type EpisodeView, type ImageView, type StepView } from '../viewer-html';

// `halo view EPISODE`: a static, self-contained HTML page of one episode, read from the trajectory blob that
// the `recordTrajectory` activity (activities/control.ts) writes at the end of every episode.

// The trajectory's shape is lib/training/experience.ts's (`TrajectorySchema`, older versions read into it); re-exported for the viewer's callers.
export type { Trajectory, TrajectoryObservation, TrajectoryStep };

/** A trajectory read from a file or blob, of any stored version (lib/training/stored-trajectory.ts), checked against the experience contract. */
async function assertTrajectory(value: unknown, source: string): Promise<Trajectory> {
  const t = value as { version?: unknown; steps?: unknown; task?: unknown; workflowId?: unknown } | null;
  if (!t || typeof t !== 'object' || (t.version !== 1 && t.version !== 2) || !Array.isArray(t.steps) || !t.task || typeof t.workflowId !== 'string') {
    throw new Error(`${source} is not an episode trajectory (expected the JSON that recordTrajectory writes: version 2 or 1, workflowId, task, steps)`);
  }
  const parsed = await readTrajectory(value, null);
  if (!parsed.success) throw new Error(describeZodError(parsed.error, `trajectory ${source}`));
  return parsed.data;
}

/** A completion's whole text: its blob, or the record's preview where there is no blob (or it is gone, said so). */
export async function completionText(c: Completion, text: (ref: string) => Promise<string | undefined>): Promise<string> {
  if (!c.ref) return c.preview;
  return (await text(c.ref)) ?? `${c.preview} (completion blob ${c.ref} missing)`;
}

/** Reads a trajectory from a blob reference (in `blobs`) or a JSON file path. */
export async function loadTrajectory(source: string, blobs: BlobStore): Promise<Trajectory> {
  if (BLOB_REF.test(source)) return assertTrajectory(await blobs.getJson(source), `blob ${source}`);
  let text: string;
  try {
    text = await readFile(source, 'utf8');
  } catch (err) {
    throw new Error(`cannot read trajectory file ${source}: ${(err as Error).message}`);
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    throw new Error(`${source} is not JSON: ${(err as Error).message}`);
  }
  return assertTrajectory(value, source);
}

/** The blob store a trajectory file lives in, when the path has the store's layout (`<root>/ab/cdef….json`). */
export function blobRootOf(path: string): string | undefined {
  const file = basename(path);
  const shard = basename(dirname(path));
  return /^[0-9a-f]{2}$/.test(shard) && /^[0-9a-f]{62}\.[a-z0-9]{1,8}$/.test(file) ? dirname(dirname(resolve(path))) : undefined;
}

function dataUrl(bytes: Buffer, ref: string): string {
  const ext = ref.slice(ref.lastIndexOf('.') + 1);
  const mime = ext === 'png' ? 'image/png' : ext === 'jpg' || ext === 'jpeg' ? 'image/jpeg' : ext === 'webp' ? 'image/webp' : 'application/octet-stream';
  return `data:${mime};base64,${bytes.toString('base64')}`;
}

/** Reads each blob once (a screenshot is the `after` of one step and the observation of the next). */
class BlobCache {
  private images = new Map<string, Promise<{ image?: ImageView; error?: string }>>();
  private texts = new Map<string, Promise<string | undefined>>();
  constructor(private readonly blobs: BlobStore) {}

  image(ref: string, fallback: { width?: number; height?: number }): Promise<{ image?: ImageView; error?: string }> {
    let p = this.images.get(ref);
    if (!p) {
      p = (async () => {
        try {
          const bytes = await this.blobs.get(ref);
          let size = { width: fallback.width ?? 0, height: fallback.height ?? 0 };
          if (ref.endsWith('.png')) size = pngSize(bytes);
          if (!size.width || !size.height) return { error: `screenshot ${ref}: unknown size` };
          return { image: { src: dataUrl(bytes, ref), ...size } };
        } catch (err) {
          return { error: err instanceof BlobNotFoundError ? `screenshot missing: ${err.message}` : `screenshot ${ref}: ${(err as Error).message}` };
        }
      })();
      this.images.set(ref, p);
    }
    return p;
  }

  text(ref: string | undefined): Promise<string | undefined> {
    if (!ref) return Promise.resolve(undefined);
    let p = this.texts.get(ref);
    if (!p) {
      p = this.blobs.get(ref).then(
        (b) => b.toString('utf8'),
        () => undefined,
      );
      this.texts.set(ref, p);
    }
    return p;
  }
}

/** The view model of a trajectory: screenshots as data URLs, overlays resolved against each step's tree. */
export async function buildEpisodeView(t: Trajectory, blobs: BlobStore, opts: { trajectoryRef?: string; jsonHref?: string } = {}): Promise<EpisodeView> {
  const cache = new BlobCache(blobs);
  const steps: StepView[] = [];
  for (const s of t.steps) {
    const obs = s.observation;
    const { image, error } = await cache.image(obs.screenshotRef, obs);
    const axtree = await cache.text(obs.axtreeRef);
    const size = image ?? { width: obs.width ?? 1280, height: obs.height ?? 720 };
    const group = t.groups?.find((g) => g.step === s.step);
    let candidates: CandidateView[] | undefined;
    if (group) {
      candidates = [];
      for (const [i, c] of group.candidates.entries()) {
        const completion = await completionText(c.completion, (ref) => cache.text(ref));
        candidates.push({ index: i, chosen: i === group.chosen, valid: c.completion.valid, reward: c.reward, completion });
      }
    }
    steps.push({
      step: s.step,
      url: obs.url,
      image,
      imageError: error,
      overlay: planOverlay(s.completion.action, axtree, size),
      completion: await completionText(s.completion, (ref) => cache.text(ref)),
      action: s.completion.action,
      valid: s.completion.valid,
      envReward: s.reward,
      shaped: s.shaped ?? { total: 0, terms: [] },
      done: s.done,
      actionError: s.actionError,
      candidates,
    });
  }
  const last = t.steps[t.steps.length - 1]?.after;
  let final: EpisodeView['final'];
  if (last) {
    const { image, error } = await cache.image(last.screenshotRef, last);
    final = { url: last.url, image, imageError: error };
  }
  const valid = t.steps.filter((s) => s.completion.valid).length;
  return {
    header: {
      workflowId: t.workflowId,
      env: t.task.env,
      task: t.task.task,
      seed: t.task.seed,
      goal: t.goal ?? t.initial?.goal ?? '',
      success: t.success,
      reward: t.reward,
      reason: t.reason,
      policyModel: t.policyModel,
      steps: t.steps.length,
      shapedReturn: t.steps.reduce((n, s) => n + (s.shaped?.total ?? 0), 0),
      actionValidity: t.steps.length ? valid / t.steps.length : 0,
      trajectoryRef: opts.trajectoryRef,
    },
    steps,
    final,
    rawJson: JSON.stringify(t, null, 2),
    jsonHref: opts.jsonHref,
  };
}

export interface WriteEpisodeViewOptions {
  /** The trajectory itself, a blob reference (`sha256:….json`, read from `blobs`) or a JSON file path. */
  trajectory: Trajectory | string;
  /** Where screenshots, trees and completions are read from. */
  blobs: BlobStore;
  /** The HTML file to write (folders are created). */
  out: string;
  /** Also write the trajectory JSON next to the page (`<out>.json` without `.html`) and link it. */
  writeJson?: boolean;
  /** Shown in the header when `trajectory` is the object itself (a reference string is shown anyway). */
  trajectoryRef?: string;
}

export interface WriteEpisodeViewResult {
  path: string;
  jsonPath?: string;
  workflowId: string;
  steps: number;
}

/** Writes the self-contained episode page; returns its path. */
export async function writeEpisodeView(opts: WriteEpisodeViewOptions): Promise<WriteEpisodeViewResult> {
  const ref = typeof opts.trajectory === 'string' && BLOB_REF.test(opts.trajectory) ? opts.trajectory : opts.trajectoryRef;
  const t = typeof opts.trajectory === 'string' ? await loadTrajectory(opts.trajectory, opts.blobs) : await assertTrajectory(opts.trajectory, 'trajectory');
  const out = resolve(opts.out);
  const jsonPath = opts.writeJson ? out.replace(/\.html?$/i, '') + '.json' : undefined;
  const view = await buildEpisodeView(t, opts.blobs, { trajectoryRef: ref, jsonHref: jsonPath ? basename(jsonPath) : undefined });
  await mkdir(dirname(out), { recursive: true });
  await writeFile(out, renderEpisodeHtml(view));
  if (jsonPath) await writeFile(jsonPath, JSON.stringify(t, null, 2) + '\n');
  return { path: out, jsonPath, workflowId: t.workflowId, steps: t.steps.length };
}

/** A file name from a workflow id (ids may hold characters a file name should not). */
export function safeFileName(id: string): string {
  return (
    id
      .replace(/[^A-Za-z0-9._-]+/g, '_')
      .replace(/^\.+/, '_')
      .slice(0, 200) || 'episode'
  );
}

export interface EpisodeSource {
  /** A blob reference or a file path, for writeEpisodeView. */
  trajectory: string;
  blobs: BlobStore;
  /** The workflow id when the episode was named by it (otherwise the trajectory's own workflowId names the file). */
  workflowId?: string;
}

/**
 * What `halo view` was given: a trajectory blob reference, a trajectory file, or an episode's workflow id
 * (looked up through Temporal: a completed episode's result holds its `trajectoryRef`).
 */
export async function resolveEpisodeSource(cfg: HaloConfig, episode: string): Promise<EpisodeSource> {
  const home = resolve(REPO_ROOT, cfg.stack.home);
  const blobs = blobStoreFor(home);
  if (BLOB_REF.test(episode)) return { trajectory: episode, blobs };
  if (existsSync(episode)) {
    const root = blobRootOf(episode);
    return { trajectory: episode, blobs: root ? new BlobStore(root) : blobs };
  }
  const { client, connection } = await connectClient(cfg);
  try {
    const handle = client.workflow.getHandle(episode);
    let status: string;
    let type: string;
    try {
      const d = await handle.describe();
      status = d.status.name;
      type = d.type;
    } catch (err) {
      if ((err as Error).name === 'WorkflowNotFoundError') {
        throw new Error(`${JSON.stringify(episode)} is neither a trajectory file, a blob reference (sha256:….json) nor a workflow in namespace ${cfg.temporal.namespace}`);
      }
      throw err;
    }
    if (status === 'RUNNING') throw new Error(`episode ${episode} is still running; its trajectory is written when it ends`);
    if (status !== 'COMPLETED') throw new Error(`workflow ${episode} ended ${status.toLowerCase().replace(/_/g, ' ')}: it has no trajectory`);
    const result = (await handle.result()) as Partial<EpisodeResult> | undefined;
    if (!result || typeof result.trajectoryRef !== 'string') {
      throw new Error(`workflow ${episode} (type ${type}) has no trajectoryRef in its result: is it an episode?`);
    }
    return { trajectory: result.trajectoryRef, blobs, workflowId: episode };
  } finally {
    await connection.close();
  }
}

export function register(program: Command, ctx: { loadConfig: (path?: string) => HaloConfig }): void {
  program
    .command('view')
    .description('write a self-contained HTML viewer of one episode (screenshots with the actions drawn on them, model output, rewards)')
    .argument('<episode>', 'episode workflow id, trajectory blob reference (sha256:….json) or trajectory JSON file')
    .option('--out <file>', 'output HTML file (default <stack.home>/views/<id>.html)')
    .option('--open-json', 'also write the trajectory JSON next to the page (linked from it)')
    .action(async (episode: string, opts: { out?: string; openJson?: boolean }) => {
      const cfg = ctx.loadConfig(program.opts().config);
      const src = await resolveEpisodeSource(cfg, episode);
      const t = await loadTrajectory(src.trajectory, src.blobs);
      const id = src.workflowId ?? t.workflowId;
      const out = opts.out ?? join(resolve(REPO_ROOT, cfg.stack.home), 'views', `${safeFileName(id)}.html`);
      const trajectoryRef = BLOB_REF.test(src.trajectory) ? src.trajectory : undefined;
      const res = await writeEpisodeView({ trajectory: t, trajectoryRef, blobs: src.blobs, out, writeJson: opts.openJson });
      console.log(res.path);
      if (res.jsonPath) console.log(res.jsonPath);
    });
}
