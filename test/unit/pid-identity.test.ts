import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { isAlive, pidFile, processIdentity, readPid, spawnBackground, stopProcess } from '../../client/processes';

// After a reboot the pid in a pid file belongs to whatever process got that number: `halo down` (and teardown.sh)
// must leave it alone. The file carries the process's identity (boot id and start time), and a bare pid is
// believed only for a process older than the file.

const REPO = resolve(__dirname, '../..');

function bystander(): ChildProcess {
  const p = spawn('sleep', ['60'], { stdio: 'ignore' });
  assert.ok(p.pid);
  return p;
}

function withHome(fn: (home: string) => Promise<void>): Promise<void> {
  const home = mkdtempSync(join(tmpdir(), 'halo-pids-'));
  mkdirSync(join(home, 'pids'));
  return fn(home).finally(() => rmSync(home, { recursive: true, force: true }));
}

test('a pid file records the identity of the process it names, and that process is stopped', () =>
  withHome(async (home) => {
    const p = spawnBackground(home, 'worker', 'sleep', ['60']);
    const [pid, ...identity] = readFileSync(pidFile(home, 'worker'), 'utf8').trim().split(' ');
    assert.equal(Number(pid), p.pid);
    assert.equal(identity.join(' '), processIdentity(p.pid));
    assert.equal(readPid(home, 'worker'), p.pid);
    assert.equal(await stopProcess(home, 'worker', 5_000), true);
  }));

test('after a reboot a pid file names another process: not reported, not signalled (halo down)', () =>
  withHome(async (home) => {
    const other = bystander();
    try {
      const [, ticks] = (processIdentity(other.pid!) ?? '').split(' ');
      writeFileSync(pidFile(home, 'control-worker'), `${other.pid} 00000000-0000-0000-0000-000000000000 ${ticks}\n`);
      assert.equal(readPid(home, 'control-worker'), undefined);
      assert.equal(await stopProcess(home, 'control-worker', 1_000), false);
      // The same boot, a pid reused by a later process: the start time differs.
      const [boot] = (processIdentity(other.pid!) ?? '').split(' ');
      writeFileSync(pidFile(home, 'learner'), `${other.pid} ${boot} 1\n`);
      assert.equal(await stopProcess(home, 'learner', 1_000), false);
      assert.ok(isAlive(other.pid!), 'an unrelated process was signalled');
    } finally {
      other.kill('SIGKILL');
    }
  }));

test('a bare pid (an older file, or the shell that started vLLM) is believed only for a process older than the file', () =>
  withHome(async (home) => {
    const other = bystander();
    try {
      const f = pidFile(home, 'vllm');
      writeFileSync(f, `${other.pid}\n`);
      assert.equal(readPid(home, 'vllm'), other.pid, 'written after the process started: it is that process');
      const hourAgo = (Date.now() - 3600_000) / 1000;
      utimesSync(f, hourAgo, hourAgo);
      assert.equal(readPid(home, 'vllm'), undefined);
      assert.equal(await stopProcess(home, 'vllm', 1_000, { group: true }), false);
      assert.ok(isAlive(other.pid!), 'an unrelated process was signalled');
    } finally {
      other.kill('SIGKILL');
    }
  }));

test('teardown.sh without Node stops the recorded process and sends nothing to one whose identity differs', () =>
  withHome(async (home) => {
    const ours = bystander();
    const other = bystander();
    try {
      writeFileSync(pidFile(home, 'control-worker'), `${ours.pid} ${processIdentity(ours.pid!)}\n`);
      writeFileSync(pidFile(home, 'temporal'), `${other.pid} 00000000-0000-0000-0000-000000000000 1\n`);
      // A bare pid from before a reboot: the file is older than the process.
      writeFileSync(pidFile(home, 'vllm'), `${other.pid}\n`);
      const hourAgo = (Date.now() - 3600_000) / 1000;
      utimesSync(pidFile(home, 'vllm'), hourAgo, hourAgo);
      const exited = new Promise((r) => ours.once('exit', r));
      // A PATH of the tools it needs and no npx: teardown's own fallback signals the pid files' processes.
      const bin = join(home, 'bin');
      mkdirSync(bin);
      for (const t of ['cat', 'sed', 'cut', 'rm', 'stat']) symlinkSync(`/usr/bin/${t}`, join(bin, t));
      const r = spawnSync('/bin/bash', [join(REPO, 'teardown.sh'), '--home', home], { encoding: 'utf8', env: { PATH: bin, HOME: home } });
      assert.match(`${r.stdout}${r.stderr}`, new RegExp(`sent SIGTERM to control-worker \\(pid ${ours.pid};`));
      await exited;
      assert.ok(isAlive(other.pid!), 'teardown.sh signalled an unrelated process');
    } finally {
      ours.kill('SIGKILL');
      other.kill('SIGKILL');
    }
  }));
