import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { vllmSamplingCheck } from '../../client/doctor-vllm';

// `halo doctor`'s sampling check: vLLM fills the fields a request leaves out from the model's generation_config.json,
// and says nothing of it over HTTP; the check reads the file when the model is a local folder.
test('doctor, vLLM sampling: a local generation config that cuts the distribution warns; neutral, unreadable remotely, or turned off passes', () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-gencfg-'));
  try {
    const base = 'http://127.0.0.1:8000/v1';
    writeFileSync(join(dir, 'generation_config.json'), JSON.stringify({ do_sample: true, temperature: 0.7, top_p: 0.8, top_k: 20 }));
    const cut = vllmSamplingCheck(base, dir, []);
    assert.equal(cut.status, 'warn');
    assert.match(cut.detail, /top_p 0\.8, top_k 20/);
    assert.match(cut.detail, /every request states top_p 1, top_k 0, min_p 0/);
    assert.match(cut.fix ?? '', /--generation-config vllm/);
    assert.equal(vllmSamplingCheck(base, dir, ['vllm', 'serve', dir, '--generation-config', 'vllm']).status, 'pass');
    writeFileSync(join(dir, 'generation_config.json'), JSON.stringify({ temperature: 0.7 }));
    assert.equal(vllmSamplingCheck(base, dir, []).status, 'pass');
    const remote = vllmSamplingCheck(base, 'Qwen/Qwen3-VL-8B-Instruct-not-here', []);
    assert.equal(remote.status, 'pass');
    assert.match(remote.detail, /does not report them/);
    assert.equal(vllmSamplingCheck('https://api.openai.com/v1', dir, []).status, 'skip');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
