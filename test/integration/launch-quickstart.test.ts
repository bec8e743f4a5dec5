import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, execFileSync } from 'node:child_process';
import { createServer } from 'node:http';
import { lookup } from 'node:dns/promises';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { REPO_ROOT } from '../../client/processes';
import { freePort } from '../../client/temporal-server';
import { listRealTasks } from '../../env/real-tasks';

const exec = promisify(execFile);
// launch.sh records what it runs (for `./launch.sh resume`): here in a folder of the test's own.
const stateDir = mkdtempSync(join(tmpdir(), 'halo-launch-'));
process.on('exit', () => rmSync(stateDir, { recursive: true, force: true }));
const launchEnv = (extra: NodeJS.ProcessEnv): NodeJS.ProcessEnv => ({
  ...process.env,
  HALO_ENV_FILE: '',
  TEMPORAL_ADDRESS: '',
  TEMPORAL_NAMESPACE: '',
  HALO_LAUNCH_STATE: join(stateDir, 'launch-state.env'),
  ...extra,
});

// The original quick start, exactly as its users type it. Offline it must stop at once (well within a minute)
// with the unreachable REAL site named, before any stack is started. On a machine that reaches the REAL
// sites, HALO_REAL_ORIGIN points every REAL page at a closed local port to stand for being offline.
test('./launch.sh --skip-setup --task v2.omnizon-1 --episodes 20 offline: stops within a minute, naming the unreachable REAL site', async () => {
  const omnizon = listRealTasks().find((t) => t.site === 'omnizon');
  assert.ok(omnizon, 'agisdk has omnizon tasks');
  const online = await lookup(new URL(omnizon.origin).hostname).then(
    () => true,
    () => false,
  );
  const env = launchEnv({});
  if (online) env.HALO_REAL_ORIGIN = `http://127.0.0.1:${await freePort()}`;
  else delete env.HALO_REAL_ORIGIN;
  const site = online ? /REAL site \(all sites, HALO_REAL_ORIGIN\) is unreachable/ : /REAL site omnizon is unreachable \(https:\/\/[^ ]+: .*\)/;

  await assert.rejects(
    exec(join(REPO_ROOT, 'launch.sh'), ['--skip-setup', '--task', 'v2.omnizon-1', '--episodes', '20'], { cwd: REPO_ROOT, env, timeout: 60_000, killSignal: 'SIGKILL' }),
    (err: { code: number | string; killed?: boolean; stderr: string }) => {
      assert.ok(!err.killed, `it ended within 60 s:\n${err.stderr}`);
      assert.equal(err.code, 2, err.stderr);
      assert.match(err.stderr, site);
      assert.match(err.stderr, /needs internet access to them/);
      // The flags were understood: the budget split and the REAL config, and nothing was started.
      assert.match(err.stderr, /--episodes 20: 4 iterations × 5 episodes = 20/);
      assert.doesNotMatch(err.stderr, /unknown option|stack is up|started run/);
      return true;
    },
  );
});

// With the sites answering, the REAL quick start is the real setup: `./launch.sh gpu` with the same flags. On a
// machine without an NVIDIA driver that stops at its first step, naming what is missing (on a GPU box this
// would install and start vLLM, so the test stays off there).
test('the REAL quick start goes on to the GPU stack once the checks pass', { skip: hasNvidiaSmi() && 'an NVIDIA driver is present' }, async () => {
  const site = createServer((_req, res) => res.end('ok'));
  await new Promise<void>((r) => site.listen(0, '127.0.0.1', r));
  try {
    const env = launchEnv({ HALO_REAL_ORIGIN: `http://127.0.0.1:${(site.address() as { port: number }).port}` });
    await assert.rejects(
      exec(join(REPO_ROOT, 'launch.sh'), ['--skip-setup', '--task', 'v2.gomail-1', '--episodes', '20'], { cwd: REPO_ROOT, env, timeout: 60_000, killSignal: 'SIGKILL' }),
      (err: { code: number; killed?: boolean; stderr: string }) => {
        assert.ok(!err.killed, err.stderr);
        assert.match(err.stderr, /no nvidia-smi: \.\/launch\.sh gpu needs an NVIDIA GPU/);
        assert.doesNotMatch(err.stderr, /stack is up|started run/);
        return true;
      },
    );
  } finally {
    site.close();
  }
});

function hasNvidiaSmi(): boolean {
  try {
    execFileSync('sh', ['-c', 'command -v nvidia-smi'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}
