import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, isAbsolute, resolve } from 'node:path';
import { parse as parseYaml } from 'yaml';
import type { HaloConfig } from '../lib/config/config';
import { ConfigError } from '../lib/config/config-error';
import { parseEvalConfig, resolveEvalPlan, type EvalConfig, type ResolveOptions } from '../lib/eval/eval-config';
import type { EvaluateInput } from '../lib/eval/eval-types';

const REPO_ROOT = resolve(__dirname, '..');

/** An eval config file; `haloConfigPath` is its `haloConfig` resolved against the file's folder. */
export function loadEvalConfigFile(path: string): { config: EvalConfig; haloConfigPath?: string } {
  const config = parseEvalConfig(readEvalConfigRaw(path), `eval config ${path}`);
  return { config, ...(config.haloConfig ? { haloConfigPath: resolve(dirname(path), config.haloConfig) } : {}) };
}

/** An eval config file as a plain object before validation, for command-line overrides. */
export function readEvalConfigRaw(path: string): unknown {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    throw new ConfigError(`cannot read eval config ${path}: ${(err as Error).message}`);
  }
  let raw: unknown;
  try {
    raw = parseYaml(text);
  } catch (err) {
    throw new ConfigError(`eval config ${path} is not valid YAML: ${(err as Error).message}`);
  }
  return raw;
}

/** The learner's checkpoints root: HALO_CHECKPOINTS, else <repo>/checkpoints; relative paths are from the repo. */
export function defaultCheckpoints(env: NodeJS.ProcessEnv = process.env): string {
  const c = env.HALO_CHECKPOINTS || 'checkpoints';
  return isAbsolute(c) ? c : resolve(REPO_ROOT, c);
}

/** The complete adapter versions of a run (folders `v<N>`; a folder only appears once complete). */
export function adapterVersionsOnDisk(checkpoints: string, run: string): number[] {
  const dir = resolve(checkpoints, run);
  if (!existsSync(dir)) return [];
  return readdirSync(dir, { withFileTypes: true })
    .filter((d) => d.isDirectory() && /^v\d+$/.test(d.name))
    .map((d) => Number(d.name.slice(1)))
    .sort((a, b) => a - b);
}

/**
 * The evaluation plan with whatever the caller leaves out read from this host: API keys from the process
 * environment, `latest` adapters and served adapters' folders from the checkpoints folder.
 */
export function resolveEvalPlanOnHost(cfg: EvalConfig, base: HaloConfig, opts: Partial<ResolveOptions> = {}): EvaluateInput {
  const env = opts.env ?? process.env;
  // Absolute, as the learner reports its folders: a served mode hands vLLM `<checkpoints>/<run>/v<N>`.
  const checkpoints = opts.checkpoints === undefined ? defaultCheckpoints(env) : resolve(REPO_ROOT, opts.checkpoints);
  return resolveEvalPlan(cfg, base, {
    ...opts,
    env,
    checkpoints,
    listAdapterVersions: opts.listAdapterVersions ?? ((run) => adapterVersionsOnDisk(checkpoints, run)),
  });
}
