import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { vllmChecks } from '../../client/doctor-vllm';
import { parseConfig } from '../../lib/config/config';
import { writeAdapterFolder } from '../../testing/adapter-folder';
import { startFakeVllmServer } from '../../testing/fake-vllm-server';

// `halo doctor` on a pool (policy.baseUrls): every replica's own checks, and whether they serve the same adapters.

const poolCfg = (urls: string[]) => parseConfig({ policy: { backend: 'openai', baseUrl: `${urls[0]}/v1`, baseUrls: urls.map((u) => `${u}/v1`) }, train: { vllmBaseUrl: urls[0] } });

test('doctor, pool: each replica checked on its own (runtime LoRA, reachability); one not answering fails the replicas row', async () => {
  const good = await startFakeVllmServer();
  const noLora = await startFakeVllmServer({ runtimeLoraUpdating: false });
  const dead = await startFakeVllmServer();
  const deadUrl = dead.url;
  await dead.close();
  try {
    const checks = await vllmChecks(poolCfg([good.url, noLora.url, deadUrl]), {}, 3000);
    const byId = new Map(checks.map((c) => [c.id, c]));
    assert.equal(byId.get('vllm#1')?.status, 'pass', JSON.stringify(checks));
    assert.equal(byId.get('vllm.lora-runtime#1')?.status, 'pass');
    assert.equal(byId.get('vllm#2')?.status, 'pass');
    assert.equal(byId.get('vllm.lora-runtime#2')?.status, 'fail', 'the second replica has no runtime LoRA endpoints');
    assert.match(byId.get('vllm.lora-runtime#2')?.detail ?? '', new RegExp(noLora.url));
    assert.equal(byId.get('vllm#3')?.status, 'fail');
    assert.match(byId.get('vllm#3')?.name ?? '', new RegExp(`replica 3, ${deadUrl}`));
    const row = byId.get('vllm.replicas');
    assert.equal(row?.status, 'fail');
    assert.match(row?.detail ?? '', new RegExp(`2 of 3 replicas answer.*not answering: ${deadUrl}/v1`));
    assert.equal(byId.has('vllm'), false, 'a pool has no unnumbered server rows');
  } finally {
    await Promise.all([good.close(), noLora.close()]);
  }
});

test('doctor, pool: replicas serving different adapters warn (a restarted one loads on demand); the same adapters pass', async () => {
  const root = mkdtempSync(join(tmpdir(), 'halo-doctor-replicas-'));
  const a = await startFakeVllmServer();
  const b = await startFakeVllmServer();
  try {
    const dir = writeAdapterFolder(root, 'run', 1);
    for (const s of [a, b]) {
      const res = await fetch(`${s.url}/v1/load_lora_adapter`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ lora_name: 'run-v1', lora_path: dir }),
      });
      assert.equal(res.status, 200);
    }
    const same = (await vllmChecks(poolCfg([a.url, b.url]), {}, 3000)).find((c) => c.id === 'vllm.replicas');
    assert.equal(same?.status, 'pass', JSON.stringify(same));
    assert.match(same?.detail ?? '', /2 of 2 replicas answer, 1 adapter served \(run-v1\)/);
    b.restart();
    const differ = (await vllmChecks(poolCfg([a.url, b.url]), {}, 3000)).find((c) => c.id === 'vllm.replicas');
    assert.equal(differ?.status, 'warn');
    assert.match(differ?.detail ?? '', new RegExp(`${b.url}/v1 lacks run-v1`));
  } finally {
    await Promise.all([a.close(), b.close()]);
    rmSync(root, { recursive: true, force: true });
  }
});
