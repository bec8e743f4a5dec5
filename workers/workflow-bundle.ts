import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { bundleWorkflowCode, DefaultLogger } from '@temporalio/worker';

/**
 * The workflow code a control worker runs, built once into one file (Temporal's `production` sample): `halo up`
 * replays the open workflows against exactly the bytes the worker will then load, and the code's hash names the
 * build, so a worker's identity says which code it runs.
 */
export interface WorkflowBundle {
  path: string;
  /** `sha256-<first 32 hex digits of the code's sha256>`. */
  buildId: string;
}

export const WORKFLOWS_PATH = require.resolve('../workflows');

export function buildIdOf(code: string): string {
  return `sha256-${createHash('sha256').update(code).digest('hex').slice(0, 32)}`;
}

/** Bundles `workflowsPath` into `<dir>/<buildId>.js` (kept when already there: same code, same build). */
export async function buildWorkflowBundle(dir: string, workflowsPath: string = WORKFLOWS_PATH): Promise<WorkflowBundle> {
  const { code } = await bundleWorkflowCode({ workflowsPath, logger: new DefaultLogger('ERROR') });
  const buildId = buildIdOf(code);
  mkdirSync(dir, { recursive: true });
  const path = join(dir, `${buildId}.js`);
  if (!existsSync(path)) {
    const partial = `${path}.${process.pid}`;
    writeFileSync(partial, code);
    renameSync(partial, path);
  } else {
    const now = new Date();
    utimesSync(path, now, now);
  }
  pruneBundles(dir);
  return { path, buildId };
}

/** Bundles kept in a folder: the newest few (a worker loads its bundle at start, so older files are only history). */
export const KEPT_BUNDLES = 5;

function pruneBundles(dir: string) {
  const bundles = readdirSync(dir)
    .filter((f) => /^sha256-[0-9a-f]{32}\.js$/.test(f))
    .map((f) => ({ path: join(dir, f), mtime: statSync(join(dir, f)).mtimeMs }))
    .sort((a, b) => b.mtime - a.mtime);
  for (const old of bundles.slice(KEPT_BUNDLES)) rmSync(old.path, { force: true });
}

/** A bundle built before (HALO_WORKFLOW_BUNDLE, as `halo up` passes it to the control worker), its hash checked again. */
export function readWorkflowBundle(path: string): WorkflowBundle {
  if (!existsSync(path)) throw new Error(`HALO_WORKFLOW_BUNDLE ${path}: no such file (halo up builds it under <home>/bundles/)`);
  return { path, buildId: buildIdOf(readFileSync(path, 'utf8')) };
}
