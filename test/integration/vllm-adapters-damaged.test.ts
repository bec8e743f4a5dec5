import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, unlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ensureAdapterLoaded, ensureAdapters, loadAdapterIntoVllm, withServedAdapter } from '../../activities/adapters';
import { writeAdapterFolder } from '../../testing/adapter-folder';
import { startFakeVllmServer, type FakeVllmServer } from '../../testing/fake-vllm-server';
import { failureOf } from '../helpers/application-failure';

// A version folder that no longer matches its manifest (torn by a crash, bit-flipped, a file gone) never reaches
// vLLM, on any path that hands it one: the training run's load, the reload after `halo up`, a sampling call's
// load (evaluation modes and runs).

let vllm: FakeVllmServer;
let root: string;

before(async () => {
  root = mkdtempSync(join(tmpdir(), 'halo-adapters-damaged-'));
  vllm = await startFakeVllmServer();
});
after(async () => {
  await vllm?.close();
  rmSync(root, { recursive: true, force: true });
});

const DAMAGE: Record<string, { damage: (dir: string) => void; why: RegExp }> = {
  'manifest torn': { damage: (d) => writeFileSync(join(d, 'manifest.json'), '{"run_id": "r", "files": {"adapter_mo'), why: /manifest\.json is not JSON/ },
  'manifest empty': { damage: (d) => writeFileSync(join(d, 'manifest.json'), ''), why: /manifest\.json is not JSON/ },
  'manifest without files': { damage: (d) => writeFileSync(join(d, 'manifest.json'), '{"version": 1}'), why: /manifest\.json has no "files" object/ },
  'manifest gone': { damage: (d) => unlinkSync(join(d, 'manifest.json')), why: /manifest\.json cannot be read \(ENOENT\)/ },
  'weights bit-flipped': {
    damage: (d) => {
      const w = readFileSync(join(d, 'adapter_model.safetensors'));
      w[3] ^= 1;
      writeFileSync(join(d, 'adapter_model.safetensors'), w);
    },
    why: /adapter_model\.safetensors does not match its sha256 in manifest\.json/,
  },
  'weights gone': { damage: (d) => unlinkSync(join(d, 'adapter_model.safetensors')), why: /adapter_model\.safetensors is missing/ },
};

function loadRequests(since: number) {
  return vllm.requests.slice(since).filter((q) => q.path === '/v1/load_lora_adapter' || q.path === '/v1/unload_lora_adapter');
}

describe('a damaged adapter folder is refused before vLLM sees it', () => {
  for (const [how, { damage, why }] of Object.entries(DAMAGE)) {
    test(how, async () => {
      const run = `dmg-${how.replace(/ /g, '-')}`;
      await loadAdapterIntoVllm({ base_url: vllm.url, run_id: run, version: 1, adapter_path: writeAdapterFolder(root, run, 1), keep: 0 });
      const dir = writeAdapterFolder(root, run, 2);
      damage(dir);
      const since = vllm.requests.length;

      const train = await failureOf(loadAdapterIntoVllm({ base_url: vllm.url, run_id: run, version: 2, adapter_path: dir, keep: 0 }));
      assert.equal(train.type, 'AdapterDamaged');
      assert.equal(train.nonRetryable, true);
      assert.match(train.message, why);
      assert.ok(train.message.includes(`${run}-v2 at ${dir} is damaged`), train.message);

      const one = await failureOf(ensureAdapterLoaded({ base_url: vllm.url, lora_name: `${run}-v2`, lora_path: dir }));
      assert.equal(one.type, 'AdapterDamaged');

      // `halo up`'s reload: the damaged one is reported failed, the others are still loaded.
      const other = writeAdapterFolder(root, `${run}-ok`, 1);
      const r = await ensureAdapters({
        base_url: vllm.url,
        adapters: [
          { lora_name: `${run}-v2`, lora_path: dir },
          { lora_name: `${run}-ok-v1`, lora_path: other },
        ],
      });
      assert.deepEqual(
        r.failed.map((f) => f.lora_name),
        [`${run}-v2`],
      );
      assert.match(r.failed[0].message, why);
      assert.deepEqual(r.loaded, [`${run}-ok-v1`]);

      // A sampling call (a served evaluation mode, a run's iteration) never makes its request.
      let called = false;
      const sample = await failureOf(
        withServedAdapter(
          { base_url: vllm.url, lora_name: `${run}-v2`, lora_path: dir },
          async () => {
            called = true;
          },
          () => undefined,
        ),
      );
      assert.equal(sample.type, 'AdapterDamaged');
      assert.equal(called, false);

      // vLLM saw no load of the damaged folder, and v1 was not unloaded to make room for it.
      assert.deepEqual(
        loadRequests(since).map((q) => (q.body as { lora_name: string }).lora_name),
        [`${run}-ok-v1`],
      );
      assert.ok(vllm.adapters.has(`${run}-v1`) && !vllm.adapters.has(`${run}-v2`));
    });
  }

  test('a whole folder loads, also after retention removed its optimiser state', async () => {
    const dir = writeAdapterFolder(root, 'whole', 1, ['adapter_config.json', 'adapter_model.safetensors', 'optimizer.safetensors', 'manifest.json']);
    unlinkSync(join(dir, 'optimizer.safetensors'));
    assert.equal((await loadAdapterIntoVllm({ base_url: vllm.url, run_id: 'whole', version: 1, adapter_path: dir })).loaded, true);
  });

  test('a folder changed after it was checked is checked again', async () => {
    const dir = writeAdapterFolder(root, 'again', 1);
    await ensureAdapterLoaded({ base_url: vllm.url, lora_name: 'again-v1', lora_path: dir });
    writeFileSync(join(dir, 'adapter_model.safetensors'), Buffer.alloc(16, 7));
    const f = await failureOf(ensureAdapterLoaded({ base_url: vllm.url, lora_name: 'again-v1b', lora_path: dir }));
    assert.equal(f.type, 'AdapterDamaged');
  });
});
