import { test } from 'node:test';
import assert from 'node:assert/strict';
import { logprobShift } from '../../client/doctor-logprobs-mode';
import { vllmChecks } from '../../client/doctor-vllm';
import { parseConfig } from '../../lib/config/config';
import { startFakeVllmServer } from '../../testing/fake-vllm-server';

// `halo doctor` tells vLLM's processed log-probs (after temperature) from raw ones (its default) over HTTP, so a
// containerised or remote server, whose command line cannot be read, is checked too: one prompt at two
// temperatures with one seed.

async function modeCheck(rawLogprobs: boolean, temperature = 0.7) {
  const vllm = await startFakeVllmServer({ rawLogprobs });
  try {
    const cfg = parseConfig({ policy: { backend: 'openai', baseUrl: `${vllm.url}/v1`, model: 'Qwen/Qwen3-VL-8B-Instruct', temperature } });
    const checks = await vllmChecks(cfg, {}, 5000);
    const c = checks.find((x) => x.id === 'vllm.logprobs-mode');
    assert.ok(c, JSON.stringify(checks));
    return { check: c, chats: vllm.chats };
  } finally {
    await vllm.close();
  }
}

test('doctor: a server started with --logprobs-mode processed_logprobs passes', async () => {
  const { check, chats } = await modeCheck(false);
  assert.equal(check.status, 'pass', JSON.stringify(check));
  assert.match(check.detail, /processed \(after temperature\)/);
  const probes = chats.slice(-2);
  assert.deepEqual(
    probes.map((c) => [c.temperature, c.seed, c.logprobs]),
    [
      [1, 1234, true],
      [0.5, 1234, true],
    ],
  );
  assert.deepEqual(probes[1].sampling, { ...probes[1].sampling, top_p: 1, top_k: 0, min_p: 0 }, 'nothing but the temperature cuts');
});

test('doctor: a server left in raw_logprobs fails at a policy temperature other than 1, naming the flag; at 1 it warns', async () => {
  const { check } = await modeCheck(true);
  assert.equal(check.status, 'fail', JSON.stringify(check));
  assert.match(check.detail, /raw \(before temperature/);
  assert.match(check.detail, /policy\.temperature is 0\.7/);
  assert.match(check.fix ?? '', /--logprobs-mode processed_logprobs/);
  const atOne = await modeCheck(true, 1);
  assert.equal(atOne.check.status, 'warn', JSON.stringify(atOne.check));
});

test('logprobShift compares one token at one position, only while both answers share the prefix', () => {
  const answer = (entries: [string, number, [string, number][]][]) => ({
    choices: [{ logprobs: { content: entries.map(([token, logprob, top]) => ({ token, logprob, top_logprobs: top.map(([t, l]) => ({ token: t, logprob: l })) })) } }],
  });
  const a = answer([
    ['x', -0.5, [['y', -1]]],
    ['p', -0.2, []],
    ['q', -0.3, []],
  ]);
  const b = answer([
    ['x', -0.5, [['y', -2]]],
    ['z', -0.9, [['p', -0.2]]],
    ['q', -9, []],
  ]);
  // Position 0: x and y; position 1: p (the samples differ there, so position 2 follows other prefixes).
  assert.deepEqual(logprobShift(a, b), { shift: 1, compared: 3 });
  assert.deepEqual(logprobShift(a, answer([['x', -9999, []]])), { shift: 0, compared: 0 }, "vLLM's placeholder is no log-prob");
  assert.equal(logprobShift({ choices: [{}] }, a), undefined);
});
