import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

// The model a stack's learner was last started with, next to its pid file: after a reboot, `halo up` and
// `halo resume` without HALO_MODEL bring back that learner (the 8B one of a GPU box), not the tiny local default.

const file = (home: string) => join(home, 'pids', 'learner.model');

export function recordedLearnerModel(home: string): string | undefined {
  try {
    return readFileSync(file(home), 'utf8').trim() || undefined;
  } catch {
    return undefined;
  }
}

export function recordLearnerModel(home: string, model: string): void {
  mkdirSync(join(home, 'pids'), { recursive: true });
  writeFileSync(file(home), `${model}\n`);
}

/** HALO_MODEL when set, else the recorded model, else the settings' default. */
export function learnerModelFor(home: string, fallback: string, env: NodeJS.ProcessEnv = process.env): string {
  return env.HALO_MODEL || recordedLearnerModel(home) || fallback;
}
