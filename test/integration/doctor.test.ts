import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { REPO_ROOT, isAlive, sleep } from '../../client/processes';
import { freePort } from '../../client/temporal-server';
import type { DoctorReport } from '../../client/doctor';

// `halo doctor` against a local stack started the user's way (`halo up`: Temporal, control and browser
// workers, the tiny learner), on a private home folder and ports; then with its browser worker killed.
const exec = promisify(execFile);
let home: string;
let cfgFile: string;
/** The workers' metrics ports (HALO_METRICS_PORT): the control worker's, then browser worker 0's, then the learner's. */
let metricsPort: number;

function halo(...args: string[]) {
  return exec(process.execPath, [join(REPO_ROOT, 'bin', 'halo.cjs'), ...args, '--config', cfgFile], {
    cwd: REPO_ROOT,
    env: {
      ...process.env,
      TEMPORAL_ADDRESS: '',
      TEMPORAL_NAMESPACE: '',
      HALO_MODEL: 'tiny-random',
      HALO_GPU_QUEUE: 'gpu',
      HF_HUB_OFFLINE: '1',
      HALO_LEARNER: '',
      HALO_METRICS_PORT: String(metricsPort),
    },
    timeout: 240_000,
  });
}

/** The doctor's JSON and exit code (execFile rejects on a non-zero exit; its stdout is still there). */
async function doctor(...args: string[]): Promise<{ code: number; stdout: string }> {
  try {
    const r = await halo('doctor', ...args);
    return { code: 0, stdout: r.stdout };
  } catch (err) {
    const e = err as { code?: number; stdout?: string };
    if (typeof e.code !== 'number') throw err;
    return { code: e.code, stdout: e.stdout ?? '' };
  }
}

before(async () => {
  home = mkdtempSync(join(tmpdir(), 'halo-doctor-'));
  metricsPort = await freePort();
  cfgFile = join(home, 'halo.yaml');
  writeFileSync(
    cfgFile,
    [
      'temporal:',
      `  address: 127.0.0.1:${await freePort()}`,
      '  controlTaskQueue: doctor-control',
      '  browserTaskQueue: doctor-browser',
      'stack:',
      `  home: ${home}`,
      `  uiPort: ${await freePort()}`,
      'policy:',
      '  backend: colocated',
      '  model: tiny-random',
      'train:',
      '  gpuTaskQueue: gpu',
    ].join('\n'),
  );
});

after(async () => {
  await halo('down').catch(() => {});
  if (!process.env.HALO_KEEP_TEST_HOME) rmSync(home, { recursive: true, force: true });
});

const LOCAL = ['temporal', 'temporal.namespace', 'temporal.search-attributes', 'worker.control', 'worker.browser', 'learner', 'chromium', 'miniwob', 'agisdk'];

test('halo doctor: every local check passes on a running stack; a stopped worker fails its check and names the fix', async () => {
  const st = JSON.parse((await halo('up', '--json')).stdout) as { browsers: number[]; learner: number };
  assert.ok(st.browsers[0] && st.learner, JSON.stringify(st));

  const ok = await doctor('--json');
  const report = JSON.parse(ok.stdout) as DoctorReport;
  const byId = new Map(report.checks.map((c) => [c.id, c]));
  for (const id of LOCAL) assert.equal(byId.get(id)?.status, 'pass', `${id}: ${JSON.stringify(byId.get(id))}`);
  assert.match(byId.get('learner')!.detail, /tiny-random on cpu/, 'the learner reports its model and device');
  assert.equal(byId.get('vllm')?.status, 'skip', 'a colocated policy needs no vLLM');
  assert.ok(byId.get('disk'), 'free disk is checked');
  assert.ok(['pass', 'skip'].includes(byId.get('gpu')!.status), 'GPU memory: nvidia-smi, or skipped without it');
  const real = byId.get('real')!;
  if (real.status === 'skip') assert.match(real.detail, /offline|not checked/, 'skipped offline, and says so');
  assert.equal(report.ok, !report.checks.some((c) => c.status === 'fail'));
  // `halo up` with HALO_METRICS_PORT: each worker serves its SDK metrics on its own port, and the doctor reads them.
  for (const [id, port] of [
    ['metrics.control', metricsPort],
    ['metrics.browser-0', metricsPort + 1],
    ['metrics.learner', metricsPort + 2],
  ] as const) {
    const c = byId.get(id);
    assert.ok(c && c.status !== 'fail' && c.detail.startsWith(`127.0.0.1:${port}: `), `${id}: ${JSON.stringify(c)}`);
  }
  // The gpu and browser queues' waits, over every worker's metrics: nothing has run on this fresh stack yet.
  assert.deepEqual(
    ['queue.gpu', 'queue.browser'].map((id) => [id, byId.get(id)?.status, byId.get(id)?.detail.replace(/:.*/, '')]),
    [
      ['queue.gpu', 'pass', 'gpu'],
      ['queue.browser', 'pass', 'doctor-browser'],
    ],
  );
  assert.equal(ok.code, report.ok ? 0 : 1, 'the exit code follows the checks');

  process.kill(st.browsers[0], 'SIGKILL');
  while (isAlive(st.browsers[0])) await sleep(100);

  const bad = await doctor('--json');
  assert.equal(bad.code, 1, 'a failed check exits non-zero');
  const badReport = JSON.parse(bad.stdout) as DoctorReport;
  assert.equal(badReport.ok, false);
  const browser = badReport.checks.find((c) => c.id === 'worker.browser')!;
  assert.equal(browser.status, 'fail', JSON.stringify(browser));
  assert.match(browser.detail, /browser-worker-0/);
  assert.match(browser.fix ?? '', /npx halo up/, 'the fix is named');
  for (const id of ['temporal', 'worker.control', 'learner']) assert.equal(badReport.checks.find((c) => c.id === id)?.status, 'pass', id);
  assert.equal(badReport.checks.find((c) => c.id === 'metrics.browser-0')?.status, 'fail', 'the dead worker serves no metrics');

  const text = await doctor();
  assert.equal(text.code, 1);
  assert.match(text.stdout, /browser worker\s+FAIL/);
  assert.match(text.stdout, /fix: npx halo up/);
});
