import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { REPO_ROOT, pythonBinary } from '../../client/processes';

// The learner's pinned requirements install on Python 3.10 (Ubuntu 22.04), 3.11 and 3.12: for each version, the
// lines whose environment markers hold there, and for each of those a wheel (`pip download --python-version X
// --only-binary=:all: --no-deps`, resolved with `pip install --dry-run --report`). pip evaluates markers against the interpreter it runs on, not against
// --python-version, so the lines are selected for the target version first (packaging's markers). It needs PyPI
// (skipped, and said so, without it) and reads each wheel's metadata once per version (HALO_PINS_CHECK=0 skips it).
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

interface PinCheck {
  skip?: string;
  pins: string[];
  resolved: string[];
  failures: string[];
}

/**
 * Resolves every pin for one Python version without installing or downloading it (`pip install --dry-run
 * --report`, which reads PyPI's wheel metadata only): a pin with no wheel for that version fails to resolve.
 */
async function checkPins(version: string): Promise<PinCheck> {
  const python = pythonBinary();
  const { stdout } = await exec(python, ['-c', SELECT, version, REQUIREMENTS]);
  const pins = stdout.trim().split('\n');
  const dir = mkdtempSync(join(tmpdir(), `halo-pins-${version}-`));
  try {
    // pip spends its time on index round trips, one package after the other: a few pip processes share the pins.
    const chunks = Array.from({ length: PARALLEL }, (_, i) => pins.filter((_, j) => j % PARALLEL === i)).filter((c) => c.length);
    const failures: string[] = [];
    const resolved: string[] = [];
    await Promise.all(
      chunks.map(async (chunk, i) => {
        const reqFile = join(dir, `requirements-${i}.txt`);
        const report = join(dir, `report-${i}.json`);
        writeFileSync(reqFile, chunk.join('\n') + '\n');
        await exec(
          python,
          [
            '-m',
            'pip',
            'install',
            '--dry-run',
            '--ignore-installed',
            '--disable-pip-version-check',
            '--quiet',
            '--report',
            report,
            '--python-version',
            version,
            '--only-binary=:all:',
            '--no-deps',
            '--target',
            join(dir, `target-${i}`),
            '-r',
            reqFile,
          ],
          { maxBuffer: 64 * 1024 * 1024 },
        ).then(
          () => {
            const r = JSON.parse(readFileSync(report, 'utf8')) as { install: { metadata: { name: string; version: string } }[] };
            resolved.push(...r.install.map((x) => `${x.metadata.name}==${x.metadata.version}`));
          },
          (err: { stderr?: string; message: string }) => {
            failures.push(
              (err.stderr ?? err.message)
                .split('\n')
                .filter((l) => l.trim() && !/^WARNING: Location/.test(l))
                .join('\n'),
            );
          },
        );
      }),
    );
    return { pins, resolved, failures };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const VERSIONS = ['3.10', '3.11', '3.12'];
// The three versions are checked at once (network round trips, not CPU); each test waits for its own.
const gate: Promise<string | undefined> = (async () => {
  if (process.env.HALO_PINS_CHECK === '0') return 'HALO_PINS_CHECK=0: the pins were not checked against PyPI';
  if (!(await pypiReachable())) return 'PyPI (https://pypi.org) is unreachable: the pins were not checked';
  return undefined;
})();
const checks = new Map(VERSIONS.map((v) => [v, gate.then((skip) => (skip ? { skip, pins: [], resolved: [], failures: [] } : checkPins(v)))]));

for (const version of VERSIONS) {
  test(`the learner's pinned requirements have a wheel for every pin on Python ${version}`, { timeout: 600_000 }, async (t) => {
    const c = await checks.get(version)!;
    if (c.skip) {
      t.skip(c.skip);
      return;
    }
    assert.ok(c.pins.length > 20 && c.pins.every((p) => /^[A-Za-z0-9_.-]+==\S+$/.test(p)), `every line is an exact pin:\n${c.pins.join('\n')}`);
    assert.deepEqual(c.failures, [], `pip could not resolve the pins for Python ${version}:\n${c.failures.join('\n')}`);
    // A local build's version label (torch 2.13.0+cpu from the local index) is the pinned release.
    const norm = (p: string) =>
      p
        .toLowerCase()
        .replace(/\+[a-z0-9.]+$/, '')
        .replace(/[_.]/g, '-');
    assert.deepEqual(c.resolved.map(norm).sort(), c.pins.map(norm).sort(), 'one wheel per pin, at the pinned version');
  });
}
