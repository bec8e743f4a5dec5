import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { hasFreeWhitespace, separatorStyle, vllmGrammarWhitespaceCheck } from '../../client/doctor-grammar-whitespace';
import { vllmChecks } from '../../client/doctor-vllm';
import { parseConfig } from '../../lib/config/config';
import { FAKE_BYTE_OFFSET } from '../../testing/fake-policy-server';
import { startFakeVllmServer } from '../../testing/fake-vllm-server';

// `halo doctor` finds out whether vLLM allows free whitespace in constrained JSON (a server setting) and compares it
// with policy.grammarWhitespace, the grammar the learner compiles.

type Release = 'vllm-0.33' | 'vllm-0.31';
const cfgFor = (url: string, grammarWhitespace: 'compact' | 'any', constrained = true, server: Release = 'vllm-0.33') =>
  parseConfig({ policy: { backend: 'openai', baseUrl: `${url}/v1`, model: 'Qwen/Qwen3-VL-8B-Instruct', constrained, grammarWhitespace, server } });

async function whitespaceCheck(
  disableAnyWhitespace: boolean,
  grammarWhitespace: 'compact' | 'any',
  constrained = true,
  played: Release = 'vllm-0.33',
  configured: Release = played,
) {
  const vllm = await startFakeVllmServer({ disableAnyWhitespace, server: played });
  try {
    const checks = await vllmChecks(cfgFor(vllm.url, grammarWhitespace, constrained, configured), {}, 5000);
    const c = checks.find((x) => x.id === 'vllm.grammar-whitespace');
    assert.ok(c, JSON.stringify(checks));
    return { check: c, requests: vllm.requests };
  } finally {
    await vllm.close();
  }
}

test('doctor: a vLLM started without disable_any_whitespace fails a compact config, naming the server flag and the setting', async () => {
  const { check, requests } = await whitespaceCheck(false, 'compact');
  assert.equal(check.status, 'fail', JSON.stringify(check));
  assert.match(check.detail, /free whitespace/);
  assert.match(check.fix ?? '', /--structured-outputs-config '\{"backend":"xgrammar","disable_any_whitespace":true\}'/);
  assert.match(check.fix ?? '', /policy\.grammarWhitespace: any/);
  // The probe favours the whitespace tokens the server's own tokenizer names, under a JSON schema.
  const tokenize = requests.filter((r) => r.path === '/tokenize').map((r) => (r.body as { prompt: string }).prompt);
  assert.deepEqual(tokenize, [' ', '\n']);
  const probe = requests.find((r) => r.path === '/v1/chat/completions' && (r.body as { structured_outputs?: unknown }).structured_outputs)!.body as {
    logit_bias: Record<string, number>;
    structured_outputs: { json: unknown };
  };
  assert.deepEqual(Object.keys(probe.logit_bias).map(Number).sort(), [FAKE_BYTE_OFFSET + 0x0a, FAKE_BYTE_OFFSET + 0x20]);
  assert.ok(probe.structured_outputs.json);
});

test('doctor: server and config agree → pass (compact) or a warning (any: whitespace has no bound); they disagree the other way → fail', async () => {
  const agreed = await whitespaceCheck(true, 'compact');
  assert.equal(agreed.check.status, 'pass', JSON.stringify(agreed.check));
  const any = await whitespaceCheck(false, 'any');
  assert.equal(any.check.status, 'warn', JSON.stringify(any.check));
  assert.match(any.check.detail, /no bound/);
  const wider = await whitespaceCheck(true, 'any');
  assert.equal(wider.check.status, 'fail', JSON.stringify(wider.check));
  assert.match(wider.check.fix ?? '', /policy\.grammarWhitespace: compact/);
  const off = await whitespaceCheck(false, 'compact', false);
  assert.equal(off.check.status, 'skip');
  assert.equal(off.requests.filter((r) => r.path === '/tokenize').length, 0, 'nothing probed');
});

test('doctor: a server without /tokenize leaves the whitespace unknown (a warning), never a guess', async () => {
  const server = createServer((_req, res) => {
    res.writeHead(404, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ detail: 'Not Found' }));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  try {
    const url = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
    const c = await vllmGrammarWhitespaceCheck(cfgFor(url, 'compact'), `${url}/v1`, { 'content-type': 'application/json' }, 5000);
    assert.equal(c.status, 'warn');
    assert.match(c.detail, /^unknown: .*\/tokenize does not exist/);
    assert.match(c.fix ?? '', /disable_any_whitespace/);
  } finally {
    server.close();
  }
});

test('doctor: a compact server of the other release (`, ` against `,`) fails, naming policy.server; the same release passes', async () => {
  for (const [played, configured] of [
    ['vllm-0.31', 'vllm-0.33'],
    ['vllm-0.33', 'vllm-0.31'],
  ] as const) {
    const { check } = await whitespaceCheck(true, 'compact', true, played, configured);
    assert.equal(check.status, 'fail', JSON.stringify(check));
    assert.match(check.detail, new RegExp(`not the call of policy.server ${configured}`));
    assert.match(check.fix ?? '', new RegExp(`set policy.server: ${played}`));
    const same = await whitespaceCheck(true, 'compact', true, played, played);
    assert.equal(same.check.status, 'pass', JSON.stringify(same.check));
    assert.match(same.check.detail, new RegExp(`as ${played} writes`));
  }
});

test('separators are read as written: `,`/`:` (0.33), `, `/`: ` (0.31), both, or free whitespace', () => {
  assert.equal(separatorStyle('{"a":1,"b":[1,2]}'), 'tight');
  assert.equal(separatorStyle('{"a": 1, "b": [1, 2]}'), 'spaced');
  assert.equal(separatorStyle('{"a":1, "b":2}'), 'mixed');
  assert.equal(separatorStyle('{"a":"x, y: z","b":2}'), 'tight', 'inside strings is text');
  assert.equal(separatorStyle('{ "a":1}'), 'any');
  assert.equal(separatorStyle('{}'), 'none');
});

test('free whitespace is whitespace outside strings other than the compact separators, within the first JSON value', () => {
  assert.equal(hasFreeWhitespace('{"a": 1, "b": [1, 2]}'), false);
  assert.equal(hasFreeWhitespace('{"a":1,"b":2}'), false);
  assert.equal(hasFreeWhitespace('{"a": "x  y\\" \\n z"}'), false);
  assert.equal(hasFreeWhitespace('<tool_call>\n{"a": 1}\n</tool_call>'), false);
  assert.equal(hasFreeWhitespace('{ "a": 1}'), true);
  assert.equal(hasFreeWhitespace('{"a" : 1}'), true);
  assert.equal(hasFreeWhitespace('{"a": 1,\n"b": 2}'), true);
  assert.equal(hasFreeWhitespace('{\n\n\n'), true, 'cut off in whitespace');
  assert.equal(hasFreeWhitespace('no json'), false);
});
