import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { REPO_ROOT, pythonBinary } from '../../client/processes';

// The learner's pinned requirements install on Python 3.10 (Ubuntu 22.04), 3.11 and 3.12: for each version, the
// lines whose environment markers hold there, and for each of those a wheel (`pip download --python-version X
// --only-binary=:all: --no-deps`). pip evaluates markers against the interpreter it runs on, not against
// --python-version, so the lines are selected for the target version first (packaging's markers). It needs PyPI
// (skipped, and said so, without it) and downloads every wheel once per version (a few minutes; HALO_PINS_CHECK=0 skips it).
const exec = promisify(execFile);
const REQUIREMENTS = join(REPO_ROOT, 'workers', 'learner', 'requirements.txt');
const PARALLEL = 4;
const SELECT = `
import sys
from packaging.requirements import Requirement
from packaging.markers import default_environment
v = sys.argv[1]
env = {**default_environment(), "python_version": v, "python_full_version": v + ".0"}
seen = {}
for raw in open(sys.argv[2]):
    line = raw.split("#", 1)[0].strip()
    if not line:
        continue
    r = Requirement(line)
    if r.marker is not None and not r.marker.evaluate(env):
        continue
    name = r.name.lower().replace("_", "-")
    assert name not in seen, f"{name} is pinned twice for Python {v}: {seen[name]} and {line}"
    seen[name] = line
    print(r.name + str(r.specifier))
`;

async function pypiReachable(): Promise<boolean> {
  try {
    const res = await fetch('https://pypi.org/simple/pip/', { signal: AbortSignal.timeout(10_000) });
    await res.body?.cancel();
    return res.ok;
  } catch {
    return false;
  }
}

for (const version of ['3.10', '3.11', '3.12']) {
  test(`the learner's pinned requirements have a wheel for every pin on Python ${version}`, { timeout: 600_000 }, async (t) => {
    if (process.env.HALO_PINS_CHECK === '0') {
      t.skip('HALO_PINS_CHECK=0: the pins were not checked against PyPI');
      return;
    }
    if (!(await pypiReachable())) {
      t.skip('PyPI (https://pypi.org) is unreachable: the pins were not checked');
      return;
    }
    const python = pythonBinary();
    const { stdout } = await exec(python, ['-c', SELECT, version, REQUIREMENTS]);
    const pins = stdout.trim().split('\n');
    assert.ok(pins.length > 20 && pins.every((p) => /^[A-Za-z0-9_.-]+==\S+$/.test(p)), `every line is an exact pin:\n${stdout}`);
    const dir = mkdtempSync(join(tmpdir(), `halo-pins-${version}-`));
    try {
      // pip spends its time on index round trips, one package after the other: a few pip processes share the pins.
      const chunks = Array.from({ length: PARALLEL }, (_, i) => pins.filter((_, j) => j % PARALLEL === i)).filter((c) => c.length);
      const failures: string[] = [];
      await Promise.all(
        chunks.map(async (chunk, i) => {
          const reqFile = join(dir, `requirements-${i}.txt`);
          writeFileSync(reqFile, chunk.join('\n') + '\n');
          await exec(
            python,
            ['-m', 'pip', 'download', '--disable-pip-version-check', '--quiet', '--python-version', version, '--only-binary=:all:', '--no-deps', '-d', join(dir, 'wheels'), '-r', reqFile],
            { maxBuffer: 64 * 1024 * 1024 },
          ).catch((err: { stderr?: string; message: string }) => {
            failures.push((err.stderr ?? err.message).split('\n').filter((l) => l.trim() && !/^WARNING: Location/.test(l)).join('\n'));
          });
        }),
      );
      assert.deepEqual(failures, [], `pip download for Python ${version} failed:\n${failures.join('\n')}`);
      const wheels = readdirSync(join(dir, 'wheels')).filter((f) => f.endsWith('.whl'));
      assert.equal(wheels.length, pins.length, `one wheel per pin: ${wheels.join(', ')}`);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
}
