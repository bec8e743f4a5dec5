import { resolve } from 'node:path';
import { haloHome } from '../host/home';
import type { HaloConfig } from '../lib/config/config';
import type { CheckStatus, DoctorCheck } from './doctor-check';
import { agisdkCheck, chromiumCheck, diskCheck, gpuCheck, miniwobCheck, realSitesCheck } from './doctor-machine';
import { vllmChecks } from './doctor-vllm';
import { workerMetricsChecks } from './doctor-metrics';
import { learnerWatchdogCheck, temporalChecks } from './doctor-workers';
import { REPO_ROOT } from './processes';

// `halo doctor`: is this machine ready to train? One row per check, each with what to do when it fails: Temporal and
// its workers (doctor-workers.ts), this machine (doctor-machine.ts), the policy's vLLM (doctor-vllm.ts).

export interface DoctorReport {
  ok: boolean;
  checks: DoctorCheck[];
}

export interface DoctorOptions {
  env?: NodeJS.ProcessEnv;
  /** Seconds each network probe may take (default 5). */
  timeoutS?: number;
}

export async function runDoctor(cfg: HaloConfig, opts: DoctorOptions = {}): Promise<DoctorReport> {
  const env = opts.env ?? process.env;
  const timeoutMs = (opts.timeoutS ?? 5) * 1000;
  const checks: DoctorCheck[] = [];
  checks.push(...(await temporalChecks(cfg, env, timeoutMs)));
  checks.push(...(await workerMetricsChecks(cfg, env, timeoutMs)));
  const local = await Promise.all([chromiumCheck(), miniwobCheck(), agisdkCheck()]);
  checks.push(...local);
  checks.push(await realSitesCheck(cfg, env, timeoutMs));
  checks.push(...(await vllmChecks(cfg, env, timeoutMs)));
  checks.push(await gpuCheck());
  checks.push(diskCheck(cfg));
  checks.push(learnerWatchdogCheck(resolve(REPO_ROOT, haloHome(env, cfg.stack.home)), cfg.train.gpuTaskQueue));
  return { ok: checks.every((c) => c.status !== 'fail'), checks };
}

const MARK: Record<CheckStatus, string> = { pass: 'pass', warn: 'WARN', fail: 'FAIL', skip: 'skip' };

/** The report as a plain table: check, status, detail, and on the next line what to do. */
export function formatDoctor(r: DoctorReport): string {
  const w = Math.max(...r.checks.map((c) => c.name.length));
  const lines = r.checks.map((c) => `${c.name.padEnd(w)}  ${MARK[c.status]}  ${c.detail}${c.fix && c.status !== 'pass' ? `\n${' '.repeat(w + 8)}fix: ${c.fix}` : ''}`);
  const n = (s: CheckStatus) => r.checks.filter((c) => c.status === s).length;
  lines.push('', `${n('pass')} passed, ${n('fail')} failed, ${n('warn')} warnings, ${n('skip')} skipped`);
  return lines.join('\n');
}
