import { test } from 'node:test';
import assert from 'node:assert/strict';
import { formatDoctor } from '../../client/doctor';
import { PROBE_PNG_DATA_URL, vllmChecks } from '../../client/doctor-vllm';
import { learnerDetail, learnerWatchdogCheck } from '../../client/doctor-workers';
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseConfig } from '../../lib/config/config';
import { startFakeVllmServer } from '../../testing/fake-vllm-server';

const realCfg = (url: string, model = 'Qwen/Qwen3-VL-8B-Instruct') => parseConfig({ policy: { backend: 'openai', baseUrl: `${url}/v1`, model }, train: { vllmBaseUrl: url } });

test('doctor, vLLM: served model and runtime LoRA updating pass; without runtime updating, that check fails and names the fix', async () => {
  for (const runtimeLoraUpdating of [true, false]) {
    const vllm = await startFakeVllmServer({ runtimeLoraUpdating });
    try {
      const checks = await vllmChecks(realCfg(vllm.url), {}, 5000);
      const byId = new Map(checks.map((c) => [c.id, c]));
      assert.equal(byId.get('vllm')?.status, 'pass', JSON.stringify(checks));
      const rt = byId.get('vllm.lora-runtime')!;
      assert.equal(rt.status, runtimeLoraUpdating ? 'pass' : 'fail', JSON.stringify(rt));
      if (!runtimeLoraUpdating) assert.match(rt.fix ?? '', /VLLM_ALLOW_RUNTIME_LORA_UPDATING=True/);
      assert.equal(vllm.adapters.size, 0, 'the probe loads nothing');
      // No vLLM process on this machine to read --max-lora-rank from: said so, not failed.
      assert.equal(byId.get('vllm.lora-rank')?.status, 'skip');
    } finally {
      await vllm.close();
    }
  }
});

test('doctor, vLLM: a model the server does not serve fails; an unreachable server fails with the way to start one', async () => {
  const vllm = await startFakeVllmServer();
  try {
    const [c] = await vllmChecks(realCfg(vllm.url, 'some/other-model'), {}, 5000);
    assert.equal(c.status, 'fail');
    assert.match(c.detail, /Qwen\/Qwen3-VL-8B-Instruct/);
  } finally {
    await vllm.close();
  }
  const [down] = await vllmChecks(realCfg('http://127.0.0.1:9'), {}, 2000);
  assert.equal(down.status, 'fail');
  assert.match(down.fix ?? '', /launch\.sh gpu/);
  const colocated = await vllmChecks(parseConfig({ policy: { backend: 'colocated', model: 'tiny-random' } }), {}, 1000);
  assert.deepEqual(
    colocated.map((c) => c.status),
    ['skip'],
  );
});

test('doctor, learner: model and device from the worker identity; an 8B model on the CPU is a warning, another model a failure', () => {
  const cfg = parseConfig({ policy: { backend: 'colocated', model: 'Qwen/Qwen3-VL-8B-Instruct' } });
  const base = { id: 'learner', name: 'learner', status: 'pass' as const, detail: '1 poller(s) on gpu' };
  const gpu = learnerDetail({ ...base, identities: ['12@box halo-learner model=Qwen/Qwen3-VL-8B-Instruct device=cuda gpu=NVIDIA_H100_80GB_HBM3'] }, cfg);
  assert.equal(gpu.status, 'pass');
  assert.match(gpu.detail, /Qwen\/Qwen3-VL-8B-Instruct on cuda \(NVIDIA H100 80GB HBM3\)/);
  const cpu = learnerDetail({ ...base, identities: ['12@box halo-learner model=Qwen/Qwen3-VL-8B-Instruct device=cpu'] }, cfg);
  assert.equal(cpu.status, 'warn');
  assert.match(cpu.fix ?? '', /CPU/);
  const other = learnerDetail({ ...base, identities: ['12@box halo-learner model=tiny-random device=cpu'] }, cfg);
  assert.equal(other.status, 'fail');
  assert.match(other.fix ?? '', /HALO_MODEL=Qwen\/Qwen3-VL-8B-Instruct/);
  const tiny = learnerDetail(
    { ...base, identities: ['12@box halo-learner model=tiny-random device=cpu'] },
    parseConfig({ policy: { backend: 'colocated', model: 'tiny-random' } }),
  );
  assert.equal(tiny.status, 'pass');
  const old = learnerDetail({ ...base, identities: ['12@box'] }, cfg);
  assert.equal(old.status, 'pass');
  assert.match(old.detail, /not reported/);
});

test('doctor table: one line per check, the fix under every failure, counts at the end', () => {
  const text = formatDoctor({
    ok: false,
    checks: [
      { id: 'a', name: 'Temporal server', status: 'pass', detail: 'ok' },
      { id: 'b', name: 'browser worker', status: 'fail', detail: 'no worker polls task queue halo-browser', fix: 'npx halo up starts it' },
    ],
  });
  assert.match(text, /^Temporal server\s+pass\s+ok$/m);
  assert.match(text, /^browser worker\s+FAIL\s+no worker polls/m);
  assert.match(text, /^\s+fix: npx halo up starts it$/m);
  assert.match(text, /1 passed, 1 failed, 0 warnings, 0 skipped/);
});

test('doctor, learner watchdog: a recent restart is a warning that says what was stuck; an old one or none passes', () => {
  const home = mkdtempSync(join(tmpdir(), 'halo-doctor-watchdog-'));
  assert.equal(learnerWatchdogCheck(home, 'gpu').status, 'pass');
  mkdirSync(join(home, 'learner'));
  const now = Date.now();
  const message = "the learner's activity slot has been busy with update_policy of run-a (attempt 1) for 700 s";
  writeFileSync(join(home, 'learner', 'watchdog-gpu-box.json'), JSON.stringify({ at: now / 1000 - 60, message }));
  writeFileSync(join(home, 'learner', 'watchdog-other-box.json'), JSON.stringify({ at: now / 1000, message: 'another queue' }));
  const recent = learnerWatchdogCheck(home, 'gpu', now);
  assert.equal(recent.status, 'warn');
  assert.match(recent.detail, /update_policy of run-a/);
  assert.equal(learnerWatchdogCheck(home, 'gpu', now + 25 * 3600_000).status, 'pass');
});

test('doctor, vLLM image input: one chat completion with a tiny PNG data URL and max_tokens 1; a refusal fails with the server message', async () => {
  // A server that takes images (and checks that they decode, as vLLM does): pass.
  const vllm = await startFakeVllmServer({ checkImages: true, recordMessages: true });
  try {
    const checks = await vllmChecks(realCfg(vllm.url), {}, 5000);
    const image = checks.find((c) => c.id === 'vllm.image');
    assert.equal(image?.status, 'pass', JSON.stringify(checks));
    assert.equal(vllm.chats.filter((c) => c.hasImage).length, 1, 'one chat completion with an image (the log-prob probe sends none)');
    assert.equal(vllm.chats[0].hasImage, true);
    const chat = vllm.requests.find((r) => r.path === '/v1/chat/completions')!.body as { model: string; max_tokens: number };
    assert.equal(chat.model, 'Qwen/Qwen3-VL-8B-Instruct');
    assert.equal(chat.max_tokens, 1);
    const parts = (vllm.messages[0][0] as { content: { type: string; image_url?: { url: string } }[] }).content;
    assert.deepEqual(
      parts.filter((p) => p.type === 'image_url').map((p) => p.image_url!.url),
      [PROBE_PNG_DATA_URL],
    );
    assert.equal(vllm.adapters.size, 0, 'the probe loads nothing');
  } finally {
    await vllm.close();
  }
  // A server that takes no images (`--limit-mm-per-prompt image=0`): fail, with vLLM's own words.
  const textOnly = await startFakeVllmServer({ maxImagesPerPrompt: 0 });
  try {
    const checks = await vllmChecks(realCfg(textOnly.url), {}, 5000);
    assert.equal(checks.find((c) => c.id === 'vllm')?.status, 'pass', 'it answers and serves the model');
    const image = checks.find((c) => c.id === 'vllm.image')!;
    assert.equal(image.status, 'fail');
    assert.match(image.detail, /HTTP 400/);
    assert.match(image.detail, /At most 0 image\(s\) may be provided in one prompt\./);
    assert.match(image.fix ?? '', /limit-mm-per-prompt/);
  } finally {
    await textOnly.close();
  }
  // A model the server does not serve: its failure is the served-model check's; the image probe is skipped.
  const other = await startFakeVllmServer();
  try {
    const checks = await vllmChecks(realCfg(other.url, 'some/other-model'), {}, 5000);
    assert.equal(checks.find((c) => c.id === 'vllm.image')?.status, 'skip');
    assert.equal(other.chats.length + other.unknownModels.length, 0, 'no chat request');
  } finally {
    await other.close();
  }
});

test('fake vLLM: an image whose bytes decode to nothing is refused as vLLM refuses it (checkImages)', async () => {
  const vllm = await startFakeVllmServer({ checkImages: true });
  try {
    const ask = (url: string) =>
      fetch(`${vllm.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          model: vllm.baseModel,
          max_tokens: 1,
          messages: [
            {
              role: 'user',
              content: [
                { type: 'image_url', image_url: { url } },
                { type: 'text', text: 'hi' },
              ],
            },
          ],
        }),
      });
    const bad = await ask(`data:image/png;base64,${Buffer.from('not a png').toString('base64')}`);
    assert.equal(bad.status, 400);
    const err = ((await bad.json()) as { error: { message: string; type: string } }).error;
    assert.equal(err.type, 'BadRequestError');
    assert.match(err.message, /^cannot identify image file/);
    const good = await ask(PROBE_PNG_DATA_URL);
    assert.equal(good.status, 200);
  } finally {
    await vllm.close();
  }
});

/** A stand-in vLLM that records the Authorization header of every request (and serves one model). */
async function recordingVllm(): Promise<{ port: number; auth: (string | undefined)[]; close: () => Promise<void> }> {
  const { createServer } = await import('node:http');
  const auth: (string | undefined)[] = [];
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      auth.push(req.headers.authorization);
      res.setHeader('content-type', 'application/json');
      if (req.url?.endsWith('/models')) res.end(JSON.stringify({ object: 'list', data: [{ id: 'm' }] }));
      else if (req.url?.endsWith('/chat/completions')) res.end(JSON.stringify({ choices: [{ index: 0, finish_reason: 'length', message: { role: 'assistant', content: 'x' } }] }));
      else res.end('"ok"');
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as { port: number }).port;
  return { port, auth, close: () => new Promise((r) => server.close(() => r())) };
}

test('doctor, vLLM key: the legacy policy.apiKeyEnv no longer picks the variable; a key never goes to a non-allowed origin nor over plain http off loopback', async () => {
  const s = await recordingVllm();
  try {
    // The probe of the issue: policy.apiKeyEnv naming AWS_SECRET_ACCESS_KEY, baseUrl at another host over plain http.
    // `0.0.0.0` reaches the stand-in server but is not loopback by name.
    const env = { AWS_SECRET_ACCESS_KEY: 'aws-secret-probe', HALO_POLICY_API_KEY: 'policy-key' };
    const legacy = parseConfig({ policy: { backend: 'openai', baseUrl: `http://0.0.0.0:${s.port}/v1`, model: 'm', apiKeyEnv: 'AWS_SECRET_ACCESS_KEY' } });
    const [c1] = await vllmChecks(legacy, env, 5000);
    assert.equal(c1.status, 'fail');
    assert.match(c1.detail, /apiKeyEnv "AWS_SECRET_ACCESS_KEY" is no longer read/);
    // The same at loopback: still refused (the variable is not the credential's), nothing sent.
    const legacyLocal = parseConfig({ policy: { backend: 'openai', baseUrl: `http://127.0.0.1:${s.port}/v1`, model: 'm', apiKeyEnv: 'AWS_SECRET_ACCESS_KEY' } });
    assert.equal((await vllmChecks(legacyLocal, env, 5000))[0].status, 'fail');
    assert.deepEqual(s.auth, [], 'the server received a request');
    // A non-allowed origin: refused with the credential, the origin and the variable to set; nothing sent.
    const foreign = parseConfig({ policy: { backend: 'openai', baseUrl: `http://0.0.0.0:${s.port}/v1`, model: 'm' } });
    const [c2] = await vllmChecks(foreign, env, 5000);
    assert.equal(c2.status, 'fail');
    assert.match(c2.detail, new RegExp(`credential "policy" \\(HALO_POLICY_API_KEY\\) is not sent to http://0\\.0\\.0\\.0:${s.port}`));
    assert.match(c2.detail, /HALO_CREDENTIAL_POLICY_ORIGINS=/);
    assert.deepEqual(s.auth, []);
    // Allowed by the operator, but plain http to a host that is not loopback: doctor probes without the key.
    const allowed = { ...env, HALO_CREDENTIAL_POLICY_ORIGINS: `http://0.0.0.0:${s.port}` };
    const checks = await vllmChecks(foreign, allowed, 5000);
    assert.equal(checks[0].status, 'pass', checks[0].detail);
    assert.ok(s.auth.length > 0);
    assert.ok(
      s.auth.every((a) => a === undefined),
      `doctor sent ${s.auth.join(', ')}`,
    );
    // Loopback at a port that is not the local server's (HALO_VLLM_PORT): refused, nothing sent.
    s.auth.length = 0;
    const local = parseConfig({ policy: { backend: 'openai', baseUrl: `http://127.0.0.1:${s.port}/v1`, model: 'm' } });
    const [c3] = await vllmChecks(local, env, 5000);
    assert.equal(c3.status, 'fail');
    assert.match(c3.detail, /only at the local server's origin/);
    assert.deepEqual(s.auth, []);
    // The local server's port: the credential's own key, mapped as the workers map it.
    await vllmChecks(local, { ...env, HALO_VLLM_PORT: String(s.port) }, 5000);
    assert.ok(s.auth.length > 0 && s.auth.every((a) => a === 'Bearer policy-key'), s.auth.join(', '));
  } finally {
    await s.close();
  }
});
