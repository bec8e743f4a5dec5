import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freePort } from '../../client/temporal-server';
import { ensureAdapterLoaded, ensureAdapters, listLoadedAdapters, loadAdapterIntoVllm, type LoadAdapterInput } from '../../activities/adapters';
import { writeAdapterFolder } from '../../testing/adapter-folder';
import { startFakeVllmServer, type FakeVllmServer } from '../../testing/fake-vllm-server';
import { failureOf } from '../helpers/application-failure';

// @temporalio/testing (MockActivityEnvironment) is not installed: the activity is called directly (outside a
// worker it simply has no cancellation signal), and its ApplicationFailure fields are what Temporal would see.

let vllm: FakeVllmServer;
let root: string;

const adapterDir = (run: string, version: number, files?: string[], contents?: Record<string, string>) => writeAdapterFolder(root, run, version, files, contents);

before(async () => {
  root = mkdtempSync(join(tmpdir(), 'halo-adapters-'));
  vllm = await startFakeVllmServer();
});
after(async () => {
  await vllm?.close();
  rmSync(root, { recursive: true, force: true });
});

describe('loadAdapterIntoVllm against the runtime LoRA API', () => {
  test('versions 1..3 with keep=1 leave v2 and v3 loaded', async () => {
    const results = [];
    for (const v of [1, 2, 3]) {
      results.push(await loadAdapterIntoVllm({ base_url: `${vllm.url}/v1`, run_id: 'run-a', version: v, adapter_path: adapterDir('run-a', v), keep: 1 }));
    }
    assert.deepEqual(
      results.map((r) => [r.name, r.loaded, r.unloaded, r.run_adapters]),
      [
        ['run-a-v1', true, [], ['run-a-v1']],
        ['run-a-v2', true, [], ['run-a-v1', 'run-a-v2']],
        ['run-a-v3', true, ['run-a-v1'], ['run-a-v2', 'run-a-v3']],
      ],
    );
    assert.deepEqual([...vllm.adapters.keys()], ['run-a-v2', 'run-a-v3']);
    const models = await listLoadedAdapters({ base_url: vllm.url });
    assert.deepEqual(
      models.map((m) => m.id),
      [vllm.baseModel, 'run-a-v2', 'run-a-v3'],
    );
    assert.equal(models[2].root, join(root, 'run-a', 'v3'));
    assert.equal(models[2].parent, vllm.baseModel);
  });

  test('loading a version again is a success that changes nothing (a retried activity)', async () => {
    const input: LoadAdapterInput = { base_url: vllm.url, run_id: 'run-a', version: 3, adapter_path: join(root, 'run-a', 'v3'), keep: 1 };
    const before = vllm.requests.length;
    const r = await loadAdapterIntoVllm(input);
    assert.deepEqual(r, { name: 'run-a-v3', loaded: false, unloaded: [], run_adapters: ['run-a-v2', 'run-a-v3'] });
    // It really asked vLLM, which answered "already loaded" (400), and that counts as done.
    const load = vllm.requests.slice(before).find((q) => q.path === '/v1/load_lora_adapter');
    assert.deepEqual(load?.body, { lora_name: 'run-a-v3', lora_path: input.adapter_path });
    assert.deepEqual([...vllm.adapters.keys()], ['run-a-v2', 'run-a-v3']);
  });

  test('keep=0 keeps only the new version; other runs are left alone', async () => {
    await loadAdapterIntoVllm({ base_url: vllm.url, run_id: 'run-b', version: 1, adapter_path: adapterDir('run-b', 1) });
    const r = await loadAdapterIntoVllm({ base_url: vllm.url, run_id: 'run-a', version: 4, adapter_path: adapterDir('run-a', 4), keep: 0 });
    assert.deepEqual(r.unloaded, ['run-a-v3', 'run-a-v2']);
    assert.deepEqual([...vllm.adapters.keys()].sort(), ['run-a-v4', 'run-b-v1']);
  });

  test('a missing adapter folder is a non-retryable failure with vLLM’s message', async () => {
    const missing = join(root, 'run-c', 'v1');
    const f = await failureOf(loadAdapterIntoVllm({ base_url: vllm.url, run_id: 'run-c', version: 1, adapter_path: missing }));
    assert.equal(f.nonRetryable, true);
    assert.equal(f.type, 'VllmAdapterRejected');
    assert.match(f.message, new RegExp(`Loading lora run-c-v1 failed: No adapter found for ${missing}`));
    assert.match(f.message, /HTTP 404 NotFoundError/);
    assert.deepEqual(f.details, [{ status: 404, type: 'NotFoundError', message: `Loading lora run-c-v1 failed: No adapter found for ${missing}` }]);
  });

  test('a folder without adapter_model.safetensors is rejected too (400)', async () => {
    const dir = adapterDir('run-d', 1, ['adapter_config.json', 'manifest.json']);
    const f = await failureOf(loadAdapterIntoVllm({ base_url: vllm.url, run_id: 'run-d', version: 1, adapter_path: dir }));
    assert.equal(f.nonRetryable, true);
    assert.match(f.message, /HTTP 400 BadRequestError: .*doesn't contain tensors/);
  });

  test("a rank above --max-lora-rank: vLLM's 500, non-retryable, naming the flag; the same folder loads once the rank fits", async () => {
    const config = JSON.stringify({ r: 16, rank_pattern: { 'model.layers.0.self_attn.q_proj': 32 } });
    const dir = adapterDir('run-r', 1, undefined, { 'adapter_config.json': config });
    const small = await startFakeVllmServer({ maxLoraRank: 16 });
    try {
      const f = await failureOf(loadAdapterIntoVllm({ base_url: small.url, run_id: 'run-r', version: 1, adapter_path: dir }));
      assert.equal(f.nonRetryable, true);
      assert.equal(f.type, 'VllmAdapterRejected');
      assert.match(f.message, /HTTP 500 InternalServerError: Call to add_lora method failed: LoRA rank 32 is greater than max_lora_rank 16\./);
      assert.match(f.message, /--max-lora-rank of at least 32/);
    } finally {
      await small.close();
    }
    const big = await startFakeVllmServer({ maxLoraRank: 32 });
    try {
      assert.deepEqual((await loadAdapterIntoVllm({ base_url: big.url, run_id: 'run-r', version: 1, adapter_path: dir })).loaded, true);
    } finally {
      await big.close();
    }
  });

  test('a server error (5xx) is retryable', async () => {
    vllm.failNext(503);
    const f = await failureOf(loadAdapterIntoVllm({ base_url: vllm.url, run_id: 'run-e', version: 1, adapter_path: adapterDir('run-e', 1) }));
    assert.equal(f.nonRetryable, false);
    assert.equal(f.type, 'VllmServerError');
    assert.match(f.message, /HTTP 503/);
  });

  test('a server that is down is a retryable failure that says so', async () => {
    const port = await freePort();
    const f = await failureOf(loadAdapterIntoVllm({ base_url: `http://127.0.0.1:${port}/v1`, run_id: 'run-a', version: 1, adapter_path: join(root, 'run-a', 'v1') }));
    assert.equal(f.nonRetryable, false);
    assert.equal(f.type, 'VllmUnreachable');
    assert.match(f.message, new RegExp(`vLLM at http://127.0.0.1:${port} unreachable .*ECONNREFUSED`));
  });

  test('runtime updating disabled on the server: non-retryable, with the fix in the message', async () => {
    const off = await startFakeVllmServer({ runtimeLoraUpdating: false });
    try {
      const f = await failureOf(loadAdapterIntoVllm({ base_url: off.url, run_id: 'run-a', version: 1, adapter_path: join(root, 'run-a', 'v1') }));
      assert.equal(f.nonRetryable, true);
      assert.match(f.message, /HTTP 404: Not Found .*VLLM_ALLOW_RUNTIME_LORA_UPDATING=True/);
    } finally {
      await off.close();
    }
  });

  test('bad input fails before any request', async () => {
    const before = vllm.requests.length;
    const f = await failureOf(loadAdapterIntoVllm({ base_url: vllm.url, run_id: 'run a', version: 1, adapter_path: '/x' }));
    assert.equal(f.nonRetryable, true);
    assert.equal(f.type, 'InvalidAdapterRequest');
    assert.equal(vllm.requests.length, before);
  });
});

describe('ensureAdapterLoaded / ensureAdapters: what a restarted vLLM forgot', () => {
  test("the fake keeps vLLM's contract: both names needed, a folder with both files, one load per name", async () => {
    const post = (path: string, body: unknown) =>
      fetch(`${vllm.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) }).then(
        async (r) => [r.status, await r.text()] as const,
      );
    assert.deepEqual(await post('/v1/load_lora_adapter', { lora_name: 'x' }), [
      400,
      JSON.stringify({ error: { message: "Both 'lora_name' and 'lora_path' must be provided.", type: 'InvalidUserInput', param: null, code: 400 } }),
    ]);
    const [s404, b404] = await post('/v1/load_lora_adapter', { lora_name: 'x', lora_path: join(root, 'nowhere') });
    assert.equal(s404, 404);
    assert.match(b404, /No adapter found for .*nowhere/);
    const dir = adapterDir('run-k', 1);
    assert.deepEqual(await post('/v1/load_lora_adapter', { lora_name: 'run-k-v1', lora_path: dir }), [200, "Success: LoRA adapter 'run-k-v1' added successfully."]);
    const [s400, b400] = await post('/v1/load_lora_adapter', { lora_name: 'run-k-v1', lora_path: dir });
    assert.equal(s400, 400);
    assert.match(b400, /The lora adapter 'run-k-v1' has already been loaded\./);
    assert.equal((await post('/v1/unload_lora_adapter', { lora_name: 'nope' }))[0], 404);
    vllm.restart();
    assert.equal(vllm.adapters.has('run-k-v1'), false, 'a restart forgets every adapter');
  });

  test('loads a forgotten adapter; a second call finds it loaded (400 "already loaded" is success)', async () => {
    vllm.restart();
    const a = { base_url: `${vllm.url}/v1`, lora_name: 'run-k-v2', lora_path: adapterDir('run-k', 2) };
    assert.deepEqual(await ensureAdapterLoaded(a), { loaded: true });
    assert.deepEqual(await ensureAdapterLoaded(a), { loaded: false });
    assert.deepEqual([...vllm.adapters.keys()], ['run-k-v2']);
  });

  test('reloads what open runs need, reports the adapters whose folders are gone, and fails retryably when vLLM is down', async () => {
    vllm.restart();
    vllm.adapters.set('run-m-v3', adapterDir('run-m', 3)); // already back (loaded by someone else)
    const adapters = [
      { lora_name: 'run-k-v2', lora_path: join(root, 'run-k', 'v2') },
      { lora_name: 'run-m-v3', lora_path: join(root, 'run-m', 'v3') },
      { lora_name: 'run-gone-v1', lora_path: join(root, 'run-gone', 'v1') },
    ];
    const r = await ensureAdapters({ base_url: vllm.url, adapters });
    assert.deepEqual(r.loaded, ['run-k-v2']);
    assert.deepEqual(r.present, ['run-m-v3']);
    assert.deepEqual(
      r.failed.map((f) => f.lora_name),
      ['run-gone-v1'],
    );
    assert.match(r.failed[0].message, /No adapter found for/);
    assert.deepEqual([...vllm.adapters.keys()].sort(), ['run-k-v2', 'run-m-v3']);

    const port = await freePort();
    const down = await failureOf(ensureAdapters({ base_url: `http://127.0.0.1:${port}`, adapters }));
    assert.equal(down.nonRetryable, false);
    assert.equal(down.type, 'VllmUnreachable');

    const bad = await failureOf(ensureAdapters({ base_url: vllm.url, adapters: [{ lora_name: 'x', lora_path: 'relative/v1' }] }));
    assert.equal(bad.type, 'InvalidAdapterRequest');
    assert.match(bad.message, /absolute path/);
  });
});
