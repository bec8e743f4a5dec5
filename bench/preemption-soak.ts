/**
 * Preemption soak: the GPU box as its users lose it. In a copy of this checkout (its own `runs/` and
 * `checkpoints/`, the default ports), the stack is started with `npx halo up` and two runs go on for `--minutes`:
 *
 * - a served GRPO run: the openai backend against the vLLM stand-in (testing/fake-vllm-server.ts, scripted model),
 *   with runtime LoRA loading of every adapter the learner writes (step grouping, N = `--n`);
 * - an MCTS run: configs/mcts-default.yaml's shape (colocated tiny-random policy, constrained, DPO updates).
 *
 * Meanwhile:
 * - every `--vllm-restart` seconds the stand-in vLLM restarts: it forgets every runtime-loaded adapter;
 * - every `--preempt-min`..`--preempt-max` seconds the whole machine goes: SIGKILL to every process the stack
 *   started (Temporal dev server, control and browser workers with their Chromium, the learner) and the stand-in
 *   vLLM closed, all at once; then, as after a reboot, vLLM comes back (empty) and `./launch.sh --skip-setup resume`
 *   brings the stack back and resumes every open run.
 *
 * At the end both runs are stopped (their current iteration finishes) and it reports: episodes and searches
 * started / completed / not completed (lost), adapter versions (each exactly once, contiguous), metrics rows (each
 * iteration exactly once), the time each preemption took to recover (kill → the next iteration of either run done),
 * and the adapter reloads the restarts cost. The exit code is non-zero when anything was lost or duplicated.
 * Needs ports 7233 and 8233 free (no other local stack running). Not part of CI.
 *
 * `--rollout stream` runs both in streaming mode (docs/streaming.md) with `--max-staleness` k (default 1): episodes
 * and searches in flight across every kill, continue-as-new after draining.
 *
 *   node --import tsx bench/preemption-soak.ts [--minutes 30] [--vllm-restart 180] [--preempt-min 360]
 *                                              [--preempt-max 540] [--n 2] [--seed 1] [--keep]
 *                                              [--rollout iterations|stream] [--max-staleness 1]
 */
import { execFileSync, spawn } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { parseArgs } from 'node:util';
import { Client, Connection } from '@temporalio/client';
import { stringify } from 'yaml';
import { readPid } from '../client/processes';
import { assertPortFree } from '../client/temporal-server';
import { parseMetricsJsonl } from '../lib/training/run-metrics';
import { startFakeVllmServer, type FakeVllmServer } from '../testing/fake-vllm-server';
import { tinyModelDir } from '../testing/model-prompt-ids';
import { load, median, printBenchHeader, printLoadAtEnd, rng, runBench } from './bench-run';

const { values } = parseArgs({
  options: {
    minutes: { type: 'string', default: '30' },
    'vllm-restart': { type: 'string', default: '180' },
    'preempt-min': { type: 'string', default: '360' },
    'preempt-max': { type: 'string', default: '540' },
    n: { type: 'string', default: '2' },
    seed: { type: 'string', default: '1' },
    keep: { type: 'boolean', default: false },
    rollout: { type: 'string', default: 'iterations' },
    'max-staleness': { type: 'string', default: '1' },
  },
});
if (values.rollout !== 'iterations' && values.rollout !== 'stream') throw new Error(`--rollout ${values.rollout}: iterations or stream`);
const rollout = { rollout: values.rollout, maxStaleness: Number(values['max-staleness']) };
const minutes = Number(values.minutes);
const vllmRestartMs = Number(values['vllm-restart']) * 1000;
const preemptMin = Number(values['preempt-min']) * 1000;
const preemptMax = Number(values['preempt-max']) * 1000;

const REPO = join(__dirname, '..');
const GRPO_RUN = 'soak-served-grpo';
const MCTS_RUN = 'soak-mcts';
const BASE = 'Qwen/Qwen3-VL-8B-Instruct';
const ADDRESS = '127.0.0.1:7233';
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** This checkout as git sees it (tracked and untracked, not ignored), with the installed tool folders linked. */
function copyCheckout(): string {
  const dir = mkdtempSync(join(tmpdir(), 'halo-soak-'));
  const files = execFileSync('git', ['ls-files', '-co', '--exclude-standard', '-z'], { cwd: REPO, encoding: 'utf8', maxBuffer: 1 << 26 })
    .split('\0')
    .filter(Boolean);
  for (const f of files) {
    if (!existsSync(join(REPO, f))) continue; // deleted in the working tree
    mkdirSync(dirname(join(dir, f)), { recursive: true });
    cpSync(join(REPO, f), join(dir, f));
  }
  for (const linked of ['node_modules', '.venv', '.venv-miniwob-official']) {
    if (existsSync(join(REPO, linked))) symlinkSync(join(REPO, linked), join(dir, linked));
  }
  return dir;
}

/** Runs a command in the copy, its output to a log there; resolves with its exit code. */
function run(dir: string, log: string, cmd: string, args: string[], env: NodeJS.ProcessEnv = {}): Promise<number> {
  return new Promise((resolve) => {
    mkdirSync(join(dir, 'soak-logs'), { recursive: true });
    const out = join(dir, 'soak-logs', log);
    writeFileSync(out, `$ ${cmd} ${args.join(' ')}\n`, { flag: 'a' });
    const child = spawn('bash', ['-c', `exec "$0" "$@" >> ${JSON.stringify(out)} 2>&1`, cmd, ...args], { cwd: dir, env: { ...process.env, ...env } });
    child.on('exit', (code) => resolve(code ?? 1));
  });
}

/** Every process the stack started (pid files under runs/pids), killed with its process group at once. */
function killMachine(dir: string): string[] {
  const home = join(dir, 'runs');
  const pids = join(home, 'pids');
  const killed: string[] = [];
  if (!existsSync(pids)) return killed;
  for (const f of readdirSync(pids).filter((n) => n.endsWith('.pid'))) {
    const name = f.replace(/\.pid$/, '');
    // The file names the process by pid and identity (the copy's own stack wrote it); readPid believes it only
    // for that very process, never for a reused pid.
    const pid = readPid(home, name);
    if (pid === undefined) continue;
    for (const target of [-pid, pid]) {
      try {
        process.kill(target, 'SIGKILL');
        killed.push(name);
        break;
      } catch {
        /* already gone, or not a group leader */
      }
    }
  }
  return killed;
}

function versionsOf(dir: string, runId: string): number[] {
  const ck = join(dir, 'checkpoints', runId);
  return existsSync(ck)
    ? readdirSync(ck)
        .filter((d) => /^v\d+$/.test(d))
        .map((d) => Number(d.slice(1)))
        .sort((a, b) => a - b)
    : [];
}

function rowsOf(dir: string, runId: string): { iteration: number; adapter_version: number | null }[] {
  const f = join(dir, 'runs', runId, 'metrics.jsonl');
  return existsSync(f) ? parseMetricsJsonl(readFileSync(f, 'utf8')) : [];
}

const iterationsOf = (dir: string, runId: string) => rowsOf(dir, runId).map((r) => r.iteration);

const contiguous = (xs: number[]) => xs.every((x, i) => x === i + 1);

async function children(client: Client, runId: string): Promise<{ type: string; status: string; id: string }[]> {
  const out: { type: string; status: string; id: string }[] = [];
  for await (const w of client.workflow.list({ query: `HaloRunId = '${runId}'` })) {
    if (w.workflowId === runId) continue;
    out.push({ type: w.type, status: w.status.name, id: w.workflowId });
  }
  return out;
}

async function main(): Promise<void> {
  printBenchHeader('preemption-soak');
  await assertPortFree(7233, 'Temporal gRPC (the soak runs the default local stack)');
  await assertPortFree(8233, 'Temporal UI');
  const random = rng(Number(values.seed));
  const dir = copyCheckout();
  console.log(`checkout copy: ${dir} (logs: ${join(dir, 'soak-logs')}, stack logs: ${join(dir, 'runs', 'logs')})`);

  // Answers in the learner's own token ids and prompt encoding once its model exists (after `halo up`): otherwise the
  // learner finds every prompt's ids differ from its own and drops every item (a served run's contract).
  let tokenizer: string | undefined;
  const startVllm = (port?: number) => startFakeVllmServer({ baseModel: BASE, mode: { kind: 'scripted' }, ...(tokenizer ? { tokenizer } : {}), ...(port ? { port } : {}) });
  let vllm: FakeVllmServer = await startVllm();
  const vllmPort = Number(new URL(vllm.url).port);
  let vllmRestarts = 0;
  const missesBefore: string[] = [];
  const restartVllm = async (down: boolean) => {
    missesBefore.push(...vllm.unknownModels);
    if (down) {
      await vllm.close();
      vllm = await startVllm(vllmPort);
    } else vllm.restart();
    vllmRestarts++;
  };

  const grpoConfig = {
    policy: { backend: 'openai', baseUrl: `${vllm.url}/v1`, model: BASE, temperature: 1, maxTokens: 64, timeoutMs: 20_000, constrained: false },
    episode: { env: 'miniwob', maxSteps: 3, heartbeatTimeoutMs: 5_000, sessionStartTimeoutMs: 10_000 },
    train: {
      runId: GRPO_RUN,
      iterations: 100_000,
      episodesPerIteration: 2,
      parallelism: 2,
      tasks: ['click-button', 'click-link', 'enter-text'],
      grouping: 'step',
      numGenerations: Number(values.n),
      learningRate: 1e-3,
      vllmBaseUrl: `${vllm.url}/v1`,
      gpuTaskQueue: 'gpu',
      learnerHeartbeatTimeoutS: 30,
      ...rollout,
    },
  };
  writeFileSync(join(dir, 'soak-grpo.yaml'), stringify(grpoConfig));
  const mctsRaw = readFileSync(join(dir, 'configs', 'mcts-default.yaml'), 'utf8')
    .replace(/runId: mcts-local/, `runId: ${MCTS_RUN}\n  rollout: ${rollout.rollout}\n  maxStaleness: ${rollout.maxStaleness}`)
    .replace(/iterations: 6\b/, 'iterations: 100000')
    .replace(/^rewards: rewards\.yaml/m, 'rewards: configs/rewards.yaml');
  writeFileSync(join(dir, 'soak-mcts.yaml'), mctsRaw);

  const env = { HALO_MODEL: 'tiny-random', HF_HUB_OFFLINE: '1' };
  const t0 = Date.now();
  const stamp = () => `[${((Date.now() - t0) / 1000).toFixed(0)}s]`;
  if ((await run(dir, 'up.log', 'npx', ['halo', 'up'], env)) !== 0) throw new Error(`halo up failed: ${join(dir, 'soak-logs', 'up.log')}`);
  console.log(`${stamp()} stack up`);
  tokenizer = join(tinyModelDir(join(dir, 'runs')), 'tokenizer.json');
  vllm.setTokenizer(tokenizer);
  if ((await run(dir, 'start.log', 'npx', ['halo', 'train', '--config', 'soak-grpo.yaml', '--detach'], env)) !== 0) throw new Error('starting the GRPO run failed');
  if ((await run(dir, 'start.log', 'npx', ['halo', 'mcts', '--config', 'soak-mcts.yaml', '--detach'], env)) !== 0) throw new Error('starting the MCTS run failed');
  console.log(
    `${stamp()} runs ${GRPO_RUN} (served GRPO) and ${MCTS_RUN} (MCTS) started, rollout ${rollout.rollout}${rollout.rollout === 'stream' ? ` (k = ${rollout.maxStaleness})` : ''}`,
  );

  const progress = () => iterationsOf(dir, GRPO_RUN).length + iterationsOf(dir, MCTS_RUN).length;
  const end = t0 + minutes * 60_000;
  let nextVllm = t0 + vllmRestartMs;
  let nextPreempt = t0 + preemptMin + random() * (preemptMax - preemptMin);
  const preemptions: { at: number; killed: string[]; resumedAfterS: number; recoveredAfterS?: number; resumeExit: number }[] = [];
  const watchRecovery = (p: (typeof preemptions)[number], before: number) => {
    void (async () => {
      while (progress() === before && Date.now() < end + 900_000) await sleep(1000);
      if (progress() > before) p.recoveredAfterS = (Date.now() - p.at) / 1000;
    })();
  };
  while (Date.now() < end) {
    if (Date.now() >= nextPreempt) {
      const at = Date.now();
      const before = progress();
      const killed = killMachine(dir);
      if (killed.length === 0) throw new Error(`preemption killed no process of the stack (pid files in ${join(dir, 'runs', 'pids')}): the soak would test nothing`);
      await restartVllm(true);
      console.log(`${stamp()} preemption: SIGKILL ${killed.join(', ')} and vLLM; ./launch.sh --skip-setup resume (load ${load()})`);
      const resumeExit = await run(dir, 'resume.log', './launch.sh', ['--skip-setup', 'resume'], env);
      const p = { at, killed, resumedAfterS: (Date.now() - at) / 1000, resumeExit };
      preemptions.push(p);
      console.log(`${stamp()} resume exited ${resumeExit} after ${p.resumedAfterS.toFixed(0)} s`);
      watchRecovery(p, before);
      nextPreempt = Date.now() + preemptMin + random() * (preemptMax - preemptMin);
      nextVllm = Date.now() + vllmRestartMs;
    } else if (Date.now() >= nextVllm) {
      await restartVllm(false);
      console.log(`${stamp()} vLLM restarted: every runtime adapter forgotten`);
      nextVllm = Date.now() + vllmRestartMs;
    }
    await sleep(1000);
  }

  console.log(`${stamp()} stopping both runs (each finishes its iteration)`);
  await run(dir, 'stop.log', 'npx', ['halo', 'stop', GRPO_RUN], env);
  await run(dir, 'stop.log', 'npx', ['halo', 'stop', MCTS_RUN], env);
  const connection = await Connection.connect({ address: ADDRESS });
  const client = new Client({ connection });
  const ended: Record<string, string> = {};
  for (const id of [GRPO_RUN, MCTS_RUN]) {
    const outcome = await Promise.race([
      client.workflow
        .getHandle(id)
        .result()
        .then(
          () => 'stopped',
          (err: Error) => `failed: ${(err as Error & { cause?: Error }).cause?.message ?? err.message}`,
        ),
      sleep(15 * 60_000).then(() => 'did not end within 15 min of the stop'),
    ]);
    ended[id] = outcome;
  }

  let bad = 0;
  console.log('');
  console.log(
    `duration ${minutes} min; vLLM restarts ${vllmRestarts} (${preemptions.length} with the machine); preemptions ${preemptions.length} every ${preemptMin / 1000}-${preemptMax / 1000} s`,
  );
  for (const id of [GRPO_RUN, MCTS_RUN]) {
    const kids = await children(client, id);
    const done = kids.filter((k) => k.status === 'COMPLETED');
    const notDone = kids.filter((k) => k.status !== 'COMPLETED');
    const versions = versionsOf(dir, id);
    const iters = iterationsOf(dir, id);
    const dup = iters.filter((x, i) => iters.indexOf(x) !== i);
    // An iteration whose update was skipped (MCTS: no pair) writes its row without a version, and no adapter:
    // every version the rows name exists once, and nothing beyond the newest.
    const rows = rowsOf(dir, id);
    const named = Math.max(0, ...rows.map((r) => r.adapter_version ?? 0));
    const skipped = rows.filter((r) => r.adapter_version === null).length;
    const once = contiguous(versions) && contiguous(iters) && dup.length === 0 && versions.length === named;
    console.log(`${id}: ${ended[id]}; ${iters.length} iterations; children started ${kids.length}, completed ${done.length}, not completed ${notDone.length}`);
    for (const k of notDone.slice(0, 5)) console.log(`  not completed: ${k.type} ${k.id} ${k.status}`);
    console.log(
      `  adapter versions ${versions.length ? `v${versions[0]}..v${versions.at(-1)}` : 'none'} (${versions.length}), metrics rows ${iters.length} (${skipped} without an update): ${once ? 'each exactly once' : `NOT exactly once: versions ${versions.join(',')} rows ${iters.join(',')}, newest named v${named}`}`,
    );
    if (!once || notDone.length > 0 || ended[id] !== 'stopped') bad++;
  }
  const recovered = preemptions.filter((p) => p.recoveredAfterS !== undefined).map((p) => p.recoveredAfterS!);
  console.log(
    `preemptions: resume took p50 ${median(preemptions.map((p) => p.resumedAfterS)).toFixed(0)} s; kill → next iteration done p50 ${median(recovered).toFixed(0)} s over ${recovered.length}/${preemptions.length}; resume exit codes ${preemptions.map((p) => p.resumeExit).join(',') || '-'}`,
  );
  const loads = vllm.requests.filter((r) => r.path === '/v1/load_lora_adapter').length;
  console.log(`adapters the restarted vLLM refused (404, then loaded again): ${[...missesBefore, ...vllm.unknownModels].length}; loads since the last restart: ${loads}`);
  printLoadAtEnd();
  await connection.close();
  await run(dir, 'down.log', 'npx', ['halo', 'down'], env);
  // Whatever `halo down` left (it gives up on a process that does not stop in time) goes as in a preemption.
  const left = killMachine(dir);
  if (left.length) console.log(`still running after halo down, killed: ${left.join(', ')}`);
  await vllm.close();
  if (!values.keep) rmSync(dir, { recursive: true, force: true });
  else console.log(`kept ${dir}`);
  if (bad > 0 || preemptions.some((p) => p.resumeExit !== 0)) process.exitCode = 1;
}

runBench(main);
