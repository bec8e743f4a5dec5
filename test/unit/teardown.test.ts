import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isAlive, REPO_ROOT } from '../../client/processes';
import { down, downCompose } from '../../client/stack';
import { parseConfig } from '../../lib/config/config';

// One stop for every stack: `halo down` and ./teardown.sh stop the vLLM that `./launch.sh gpu` recorded in
// runs/pids/vllm.pid (with its engine processes: its process group), and the docker compose stack, naming what
// they stopped. vLLM here is a stand-in: a process group (a shell and its child) as `setsid vllm serve` makes.

// Whatever a failing test leaves running is killed at the end (the stand-ins lead their own process groups).
const standIns: number[] = [];
after(() => {
  for (const pid of standIns) {
    try {
      process.kill(-pid, 'SIGKILL');
    } catch {
      /* stopped, as it should be */
    }
  }
});

/** A stand-in vLLM: a group leader with a child, recorded as <home>/pids/vllm.pid like bin/launch-gpu.sh does. */
function standInVllm(home: string): { leader: ChildProcess; child: () => number } {
  mkdirSync(join(home, 'pids'), { recursive: true });
  const childFile = join(home, 'child.pid');
  const leader = spawn('bash', ['-c', `sleep 600 & echo $! > ${childFile}; wait`], { detached: true, stdio: 'ignore' });
  leader.unref();
  standIns.push(leader.pid!);
  writeFileSync(join(home, 'pids', 'vllm.pid'), `${leader.pid}\n`);
  return {
    leader,
    child: () => {
      for (let i = 0; i < 50 && !existsSync(childFile); i++) spawnSync('sleep', ['0.1']);
      return Number(readFileSync(childFile, 'utf8').trim());
    },
  };
}

/** A fake `docker`: logs every call; `compose ps` answers with the given running services. */
function fakeDocker(dir: string, running: string[]): { bin: string; log: string } {
  const bin = join(dir, 'bin');
  mkdirSync(bin, { recursive: true });
  const log = join(dir, 'docker.log');
  writeFileSync(join(bin, 'docker'), `#!/bin/sh\necho "docker $*" >> ${log}\ncase "$*" in "compose ps"*) printf '${running.map((s) => `${s}\\n`).join('')}' ;; esac\nexit 0\n`, {
    mode: 0o755,
  });
  return { bin, log };
}

/** Waits up to 5 s for signalled processes to exit: on a loaded machine they take a moment. */
function untilExited(...pids: number[]): void {
  for (let i = 0; i < 50 && pids.some((p) => isAlive(p)); i++) spawnSync('sleep', ['0.1']);
}

test('halo down stops the vLLM that ./launch.sh gpu recorded, its whole process group, and names it', async () => {
  const home = mkdtempSync(join(tmpdir(), 'halo-down-vllm-'));
  try {
    const vllm = standInVllm(home);
    const child = vllm.child();
    assert.ok(isAlive(vllm.leader.pid!) && isAlive(child));
    const said: string[] = [];
    await down(parseConfig({ stack: { home } }), (m) => said.push(m));
    untilExited(vllm.leader.pid!, child);
    assert.equal(isAlive(vllm.leader.pid!), false, 'vLLM stopped');
    assert.equal(isAlive(child), false, "vLLM's engine process (same group) stopped too");
    assert.ok(
      said.some((m) => m.startsWith(`stopped vLLM (pid ${vllm.leader.pid}, started by ./launch.sh gpu`)),
      said.join('\n'),
    );
    assert.equal(existsSync(join(home, 'pids', 'vllm.pid')), false);
    // Twice is fine, and says nothing about vLLM.
    const again: string[] = [];
    await down(parseConfig({ stack: { home } }), (m) => again.push(m));
    assert.ok(!again.some((m) => /vLLM/.test(m)));
  } finally {
    rmSync(home, { recursive: true, force: true });
  }
});

test('./teardown.sh on the ./launch.sh gpu stack (no docker compose): stops the stand-in vLLM and names it', () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-teardown-'));
  const home = join(dir, 'runs');
  try {
    const vllm = standInVllm(home);
    const child = vllm.child();
    const docker = fakeDocker(dir, []);
    const r = spawnSync(join(REPO_ROOT, 'teardown.sh'), ['--home', home], {
      cwd: REPO_ROOT,
      env: { ...process.env, PATH: `${docker.bin}:${process.env.PATH}`, HALO_ENV_FILE: '' },
      encoding: 'utf8',
      timeout: 120_000,
    });
    const out = `${r.stdout}${r.stderr}`;
    assert.equal(r.status, 0, out);
    assert.doesNotMatch(out, /docker is not installed/);
    assert.match(out, new RegExp(`the launch\\.sh stack runs: vllm \\(pid ${vllm.leader.pid}\\); stopping it with npx halo down`));
    assert.match(out, new RegExp(`halo: stopped vLLM \\(pid ${vllm.leader.pid}, started by \\./launch\\.sh gpu`));
    assert.match(out, /no docker compose service runs/);
    assert.match(out, /teardown: done; state kept/);
    untilExited(vllm.leader.pid!, child);
    assert.equal(isAlive(vllm.leader.pid!), false);
    assert.equal(isAlive(child), false);
    // The compose part asked docker what runs and stopped nothing.
    assert.doesNotMatch(readFileSync(docker.log, 'utf8'), /compose stop/);

    // Nothing left: says so, and without docker at all it is no error either.
    const none = spawnSync('/bin/bash', [join(REPO_ROOT, 'teardown.sh'), '--home', home], { cwd: REPO_ROOT, env: { PATH: '/nonexistent' }, encoding: 'utf8' });
    assert.equal(none.status, 0, none.stderr);
    assert.match(none.stdout, /no process of the launch\.sh stack runs/);
    assert.match(none.stdout, /docker is not installed here: no docker compose stack to stop/);
    assert.match(none.stdout, /nothing was running/);

    // Without Node.js (no npx), each recorded process group still gets its SIGTERM, named.
    const again = standInVllm(home);
    const bare = join(dir, 'bare');
    mkdirSync(bare);
    for (const tool of ['tr', 'rm', 'sed']) symlinkSync(spawnSync('bash', ['-c', `command -v ${tool}`], { encoding: 'utf8' }).stdout.trim(), join(bare, tool));
    const noNode = spawnSync('/bin/bash', [join(REPO_ROOT, 'teardown.sh'), '--home', home], { cwd: REPO_ROOT, env: { PATH: bare }, encoding: 'utf8' });
    assert.equal(noNode.status, 0, noNode.stderr);
    assert.match(noNode.stdout, new RegExp(`sent SIGTERM to vllm \\(pid ${again.leader.pid}; no npx here`));
    untilExited(again.leader.pid!);
    assert.equal(isAlive(again.leader.pid!), false);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('halo down (and ./teardown.sh) stop a running docker compose stack, workers first, naming the services', () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-down-compose-'));
  try {
    const docker = fakeDocker(dir, ['vllm', 'control-worker']);
    const env = { ...process.env, PATH: `${docker.bin}:${process.env.PATH}`, HALO_DOWN_COMPOSE: '' };
    const said: string[] = [];
    // Another home (a test's, `--home`) never touches the repository's compose stack.
    assert.deepEqual(
      downCompose(join(dir, 'runs'), (m) => said.push(m), env),
      [],
    );
    assert.equal(existsSync(docker.log), false);
    assert.deepEqual(
      downCompose(join(REPO_ROOT, 'runs'), (m) => said.push(m), { ...env, HALO_DOWN_COMPOSE: '0' }),
      [],
    );
    assert.deepEqual(
      downCompose(join(REPO_ROOT, 'runs'), (m) => said.push(m), env),
      ['vllm', 'control-worker'],
    );
    const calls = readFileSync(docker.log, 'utf8').trim().split('\n');
    const stopWorkers = calls.findIndex((c) => /^docker compose stop -t \d+ control-worker browser-worker learner$/.test(c));
    const stopRest = calls.findIndex((c) => /^docker compose stop -t 60$/.test(c));
    assert.ok(stopWorkers >= 0 && stopWorkers < stopRest, calls.join('\n'));
    assert.ok(
      said.some((m) => m === 'stopped the docker compose services vllm, control-worker (volumes kept: docker compose up -d resumes)'),
      said.join('\n'),
    );

    // ./teardown.sh --compose-only names them too.
    const r = spawnSync(join(REPO_ROOT, 'teardown.sh'), ['--compose-only'], { cwd: REPO_ROOT, env, encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /teardown: stopped the docker compose services: vllm control-worker/);
    assert.doesNotMatch(r.stdout, /launch\.sh stack/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("`halo down` is wired to stop compose's stack for the repository's home", () => {
  const cli = readFileSync(join(REPO_ROOT, 'client/cli.ts'), 'utf8');
  assert.match(cli, /if \(!roles\) downCompose\(stackStatus\(cfg\)\.home, /);
});

test('./teardown.sh stops the replicas of docker-compose.replicas.yml too: compose is given both files', () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-down-replicas-'));
  const replicas = join(REPO_ROOT, 'docker-compose.replicas.yml');
  // A box's own override is left as it was; the test writes one only where there is none.
  const ours = !existsSync(replicas);
  try {
    if (ours) writeFileSync(replicas, 'services: {}\n');
    const bin = join(dir, 'bin');
    mkdirSync(bin, { recursive: true });
    const log = join(dir, 'docker.log');
    writeFileSync(join(bin, 'docker'), `#!/bin/sh\necho "COMPOSE_FILE=$COMPOSE_FILE docker $*" >> ${log}\ncase "$*" in "compose ps"*) printf 'vllm-2\\n' ;; esac\nexit 0\n`, {
      mode: 0o755,
    });
    const env = { ...process.env, PATH: `${bin}:${process.env.PATH}`, COMPOSE_FILE: '' };
    const r = spawnSync(join(REPO_ROOT, 'teardown.sh'), ['--compose-only'], { cwd: REPO_ROOT, env, encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    const calls = readFileSync(log, 'utf8').trim().split('\n');
    assert.ok(calls.length >= 2, calls.join('\n'));
    for (const c of calls) assert.match(c, /^COMPOSE_FILE=docker-compose\.yml:docker-compose\.replicas\.yml docker compose /);
    assert.match(r.stdout, /teardown: stopped the docker compose services: vllm-2/);
  } finally {
    if (ours) rmSync(replicas, { force: true });
    rmSync(dir, { recursive: true, force: true });
  }
});
