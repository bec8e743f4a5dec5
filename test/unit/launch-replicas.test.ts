import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isAlive, REPO_ROOT } from '../../client/processes';
import { down, vllmProcesses } from '../../client/stack';
import { parseConfig } from '../../lib/config/config';

// `./launch.sh gpu` on a box of N GPUs (bin/launch-gpu.sh gpu_split): the plan --dry-run prints, with a stand-in
// nvidia-smi on PATH listing N GPUs; and `halo down` stopping every replica it started.

const dirs: string[] = [];
const standIns: number[] = [];
after(() => {
  for (const pid of standIns) {
    try {
      process.kill(-pid, 'SIGKILL');
    } catch {
      /* stopped, as it should be */
    }
  }
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

function tmp(prefix: string): string {
  const d = mkdtempSync(join(tmpdir(), prefix));
  dirs.push(d);
  return d;
}

/** `./launch.sh --skip-setup gpu <args> --dry-run` where nvidia-smi lists `gpus` H200s. */
function plan(gpus: number, args: string[] = [], env: Record<string, string> = {}): string[] {
  const dir = tmp('halo-launch-replicas-');
  const bin = join(dir, 'bin');
  mkdirSync(bin);
  const list = Array.from({ length: gpus }, (_, i) => `GPU ${i}: NVIDIA H200 (UUID: GPU-${i})`).join('\\n');
  writeFileSync(join(bin, 'nvidia-smi'), `#!/bin/sh\nprintf '${list}\\n'\n`, { mode: 0o755 });
  const out = execFileSync(join(REPO_ROOT, 'launch.sh'), ['--skip-setup', 'gpu', ...args, '--dry-run'], {
    cwd: REPO_ROOT,
    env: {
      ...process.env,
      PATH: `${bin}:${process.env.PATH}`,
      HALO_GPUS: '',
      HALO_LEARNER_GPUS: '',
      HALO_LORA_RANK: '',
      HALO_POLICY_API_KEY: '',
      HALO_ENV_FILE: '',
      HALO_LAUNCH_STATE: join(dir, 'state.env'),
      ...env,
    },
    encoding: 'utf8',
  });
  return out.split('\n').filter(Boolean);
}

const serves = (lines: string[]) => lines.filter((l) => /\/vllm serve /.test(l));
const flag = (line: string, name: string) => new RegExp(` ${name} (\\S+)`).exec(line)?.[1];
const device = (line: string) => /CUDA_VISIBLE_DEVICES=(\S+) /.exec(line)?.[1];

test('1 GPU: one vLLM at half the memory beside the learner, as before: no device pinning, no pool', () => {
  const lines = plan(1);
  assert.ok(lines.includes('# 1 GPU: vLLM (--gpu-memory-utilization 0.5) and the learner share it'));
  const [serve, ...more] = serves(lines);
  assert.equal(more.length, 0);
  assert.equal(device(serve), undefined);
  assert.deepEqual([flag(serve, '--port'), flag(serve, '--gpu-memory-utilization')], ['8000', '0.5']);
  const train = lines.find((l) => / npx halo train /.test(l));
  assert.ok(train && !/--policy-url|CUDA_VISIBLE_DEVICES|HALO_LEARNER_GPUS/.test(train), train);
});

test('2 GPUs: the learner on GPU 0, one replica on GPU 1 at high memory utilisation; the run samples from it', () => {
  const lines = plan(2, ['--lr', '2e-5']);
  const [serve, ...more] = serves(lines);
  assert.equal(more.length, 0);
  assert.deepEqual([device(serve), flag(serve, '--port'), flag(serve, '--gpu-memory-utilization')], ['1', '8000', '0.9']);
  assert.match(serve, /> runs\/logs\/vllm\.log .*runs\/pids\/vllm\.pid/);
  const up = lines.find((l) => l.endsWith(' npx halo up'));
  assert.match(up ?? '', /CUDA_VISIBLE_DEVICES=0 HALO_LEARNER_GPUS=1 npx halo up$/);
  const train = lines.find((l) => / npx halo train /.test(l));
  assert.match(train ?? '', /npx halo train --config configs\/grpo-real\.yaml --policy-url http:\/\/127\.0\.0\.1:8000\/v1 --lr 2e-5$/);
  assert.match(lines.find((l) => /^mkdir -p .*state\.env$/.test(l)) ?? '', / HALO_GPUS=2 HALO_LEARNER_GPUS=1 /, 'resume brings back the same split');
});

test('8 GPUs: seven replicas, one per GPU and port, each waited for, all in the pool; HALO_LEARNER_GPUS moves the split', () => {
  const lines = plan(8);
  assert.ok(lines.some((l) => l.startsWith('# 8 GPUs: the learner on GPU 0 (HALO_LEARNER_GPUS=1), 7 vLLM replicas on GPU 1 2 3 4 5 6 7')));
  const s = serves(lines);
  assert.deepEqual(
    s.map((l) => [device(l), flag(l, '--port'), flag(l, '--gpu-memory-utilization')]),
    [1, 2, 3, 4, 5, 6, 7].map((g) => [String(g), String(7999 + g), '0.9']),
  );
  const names = ['vllm', 'vllm-2', 'vllm-3', 'vllm-4', 'vllm-5', 'vllm-6', 'vllm-7'];
  s.forEach((l, i) => assert.match(l, new RegExp(`runs/logs/${names[i]}\\.log .*runs/pids/${names[i]}\\.pid`)));
  // A replica already answering is left alone; every one is waited for before the workers start.
  s.forEach((l, i) => assert.ok(l.startsWith(`curl -sf http://127.0.0.1:${8000 + i}/health >/dev/null || `)));
  const waits = lines.filter((l) => l.startsWith('until curl'));
  assert.equal(waits.length, 7);
  const upAt = lines.findIndex((l) => l.endsWith(' npx halo up'));
  assert.ok(lines.indexOf(waits[6]) < upAt);
  const pool = Array.from({ length: 7 }, (_, i) => `http://127.0.0.1:${8000 + i}/v1`).join(',');
  assert.ok(lines.find((l) => / npx halo train /.test(l))?.endsWith(`--policy-url ${pool}`));
  // The workers may send the policy key to the other replicas' loopback ports too.
  assert.match(lines[upAt], /HALO_CREDENTIAL_POLICY_ORIGINS=http:\/\/127\.0\.0\.1:8001,.*,http:\/\/127\.0\.0\.1:8006 /);
  for (const l of s) assert.equal(spawnSync('bash', ['-n', '-c', l]).status, 0, `valid bash: ${l}`);

  const two = plan(8, [], { HALO_LEARNER_GPUS: '2' });
  assert.deepEqual(serves(two).map(device), ['2', '3', '4', '5', '6', '7']);
  assert.match(two.find((l) => l.endsWith(' npx halo up')) ?? '', /CUDA_VISIBLE_DEVICES=0,1 HALO_LEARNER_GPUS=2 /);
  // HALO_GPUS overrides what nvidia-smi lists; `gpu serve` starts the same replicas.
  assert.equal(serves(plan(8, ['serve'], { HALO_GPUS: '3' })).length, 2);
});

test('a split that cannot be made stops with the reason', () => {
  assert.throws(() => plan(2, [], { HALO_LEARNER_GPUS: '2' }), /HALO_LEARNER_GPUS=2 leaves none of the 2 GPUs for vLLM: at most 1/);
  assert.throws(() => plan(2, [], { HALO_GPUS: 'two' }), /HALO_GPUS=two: a number of GPUs/);
});

/** A stand-in vLLM replica: a group leader with a child, recorded as <home>/pids/<name>.pid like bin/launch-gpu.sh does. */
function standIn(home: string, name: string): ChildProcess {
  mkdirSync(join(home, 'pids'), { recursive: true });
  const leader = spawn('bash', ['-c', 'sleep 600 & wait'], { detached: true, stdio: 'ignore' });
  leader.unref();
  standIns.push(leader.pid!);
  writeFileSync(join(home, 'pids', `${name}.pid`), `${leader.pid}\n`);
  return leader;
}

test('halo down stops every vLLM replica ./launch.sh gpu started, and names each', async () => {
  const home = tmp('halo-down-replicas-');
  const replicas = ['vllm', 'vllm-2', 'vllm-10'].map((n) => ({ n, p: standIn(home, n) }));
  writeFileSync(join(home, 'pids', 'vllm-old.pid'), '1\n'); // not a replica's name: left alone
  assert.deepEqual(vllmProcesses(home), ['vllm', 'vllm-2', 'vllm-10']);
  const said: string[] = [];
  await down(parseConfig({ stack: { home } }), (m) => said.push(m));
  for (let i = 0; i < 50 && replicas.some((r) => isAlive(r.p.pid!)); i++) await new Promise((r) => setTimeout(r, 100));
  for (const r of replicas) {
    assert.equal(isAlive(r.p.pid!), false, `${r.n} stopped`);
    assert.equal(existsSync(join(home, 'pids', `${r.n}.pid`)), false);
  }
  assert.ok(said.some((m) => m.startsWith(`stopped vLLM (pid ${replicas[0].p.pid}, started by ./launch.sh gpu`)));
  assert.ok(said.some((m) => m.startsWith(`stopped vLLM replica vllm-2 (pid ${replicas[1].p.pid}`)));
  assert.ok(said.some((m) => m.includes(`log ${join(home, 'logs', 'vllm-10.log')}`)));
});
