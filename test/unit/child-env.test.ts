import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { browserEnv, minimalChildEnv, withoutModelKeys } from '../../env/child-env';
import { evaluateFinalState } from '../../env/real-eval';

const SECRETS = {
  OPENAI_API_KEY: 'sk-test-not-for-children',
  HALO_POLICY_API_KEY: 'hp-secret',
  TEMPORAL_API_KEY: 'tk-secret',
  AWS_SECRET_ACCESS_KEY: 'aws-secret',
  HF_TOKEN: 'hf-secret',
};

test('an eval script sees PATH, HOME, the locale and PYTHON* settings, and none of the worker secrets', async () => {
  const saved = { ...process.env };
  Object.assign(process.env, SECRETS, { PYTHONPATH: '/opt/extra', LC_ALL: 'C.UTF-8' });
  try {
    const dir = mkdtempSync(join(tmpdir(), 'halo-child-env-'));
    const path = join(dir, 'env_probe.py');
    writeFileSync(path, 'import json, os\nprint(json.dumps(dict(os.environ)))\n');
    const res = await evaluateFinalState({ id: 'probe', evalScript: 'env_probe.py', evalScriptPath: path, evalSha256: null, scorable: true }, {}, { maxOutputChars: 1_000_000 });
    assert.equal(res.error, undefined, res.stderr);
    const seen = JSON.parse(res.output) as Record<string, string>;
    for (const [name, value] of Object.entries(SECRETS)) {
      assert.equal(seen[name], undefined, `${name} reached the eval script`);
      assert.ok(!res.output.includes(value), `the value of ${name} reached the eval script`);
    }
    assert.equal(seen.PATH, process.env.PATH);
    assert.equal(seen.PYTHONPATH, '/opt/extra');
    assert.equal(seen.LC_ALL, 'C.UTF-8');
    assert.equal(seen.PYTHONIOENCODING, 'utf-8');
  } finally {
    for (const k of Object.keys(process.env)) if (!(k in saved)) delete process.env[k];
    Object.assign(process.env, saved);
  }
});

test('minimalChildEnv keeps only the names an interpreter needs', () => {
  const env = minimalChildEnv(
    { PATH: '/bin', HOME: '/h', LANG: 'C', OPENAI_API_KEY: 'x', PYTHONHOME: '/p', LC_CTYPE: 'C', SECRET: 'y', TEMPORAL_ADDRESS: 'a' },
    { PYTHONIOENCODING: 'utf-8' },
  );
  assert.deepEqual(env, { PATH: '/bin', HOME: '/h', LANG: 'C', PYTHONHOME: '/p', LC_CTYPE: 'C', PYTHONIOENCODING: 'utf-8' });
});

test('a browser worker gets no model-server key, mapped names included; Chromium only its allow-list', () => {
  const env = { PATH: '/bin', HALO_POLICY_API_KEY: 'hp', OPENAI_API_KEY: 'o', MINE: 'm', HALO_CREDENTIAL_BASELINE_ENV: 'MINE', TEMPORAL_ADDRESS: 'a', AWS_SECRET_ACCESS_KEY: 's' };
  assert.deepEqual(withoutModelKeys(env), { PATH: '/bin', OPENAI_API_KEY: 'o', HALO_CREDENTIAL_BASELINE_ENV: 'MINE', TEMPORAL_ADDRESS: 'a', AWS_SECRET_ACCESS_KEY: 's' });
  assert.deepEqual(browserEnv({ ...env, HOME: '/h', LC_ALL: 'C', XDG_RUNTIME_DIR: '/run/u', DISPLAY: ':0', TEMPORAL_API_KEY: 't' }), {
    PATH: '/bin',
    HOME: '/h',
    LC_ALL: 'C',
    XDG_RUNTIME_DIR: '/run/u',
    DISPLAY: ':0',
  });
});
