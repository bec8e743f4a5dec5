import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { ApplicationFailure } from '@temporalio/common';
import { chatCompletions } from '../../activities/policy-client';
import { ensureAdapterLoaded, ensureAdapters, listLoadedAdapters } from '../../activities/adapters';
import { parseConfig, type PolicyConfig } from '../../lib/config/config';
import { credentialEnvVar, resolveCredential } from '../../lib/serving/credentials';
import { withEnv } from '../helpers/with-env';

// The key probe: a workflow input that names an unrelated environment variable must not make the worker send
// that variable's value anywhere. The local server records every request it receives, headers and body.
const SECRET = 'probe-secret-7f3a9c';
const POLICY_KEY = 'policy-key-1b2c';
const seen: { url: string; headers: IncomingMessage['headers']; body: string }[] = [];
let server: Server;
let base: string;
const saved = { ...process.env };

before(async () => {
  process.env.HALO_PROBE_SECRET = SECRET;
  process.env.HALO_POLICY_API_KEY = POLICY_KEY;
  delete process.env.HALO_CREDENTIAL_POLICY_ENV;
  delete process.env.HALO_CREDENTIAL_HTTP_HOSTS;
  delete process.env.HALO_CREDENTIAL_POLICY_ORIGINS;
  delete process.env.OPENAI_API_KEY;
  delete process.env.HALO_CREDENTIAL_BASELINE_ORIGINS;
  server = createServer((req, res) => {
    let body = '';
    req.on('data', (c: Buffer) => (body += c.toString('utf8')));
    req.on('end', () => {
      seen.push({ url: req.url ?? '', headers: req.headers, body });
      res.setHeader('content-type', 'application/json');
      if (req.url?.endsWith('/chat/completions')) {
        res.end(
          JSON.stringify({
            id: 'x',
            object: 'chat.completion',
            created: 0,
            model: 'm',
            choices: [{ index: 0, finish_reason: 'stop', message: { role: 'assistant', content: 'ok' } }],
          }),
        );
      } else if (req.url?.endsWith('/models')) {
        res.end(JSON.stringify({ object: 'list', data: [{ id: 'm' }] }));
      } else {
        res.end('"Success"');
      }
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  // The stand-in is the local vLLM, at the port the operator gives the workers.
  process.env.HALO_VLLM_PORT = String((server.address() as AddressInfo).port);
});

after(async () => {
  for (const k of [
    'HALO_PROBE_SECRET',
    'HALO_POLICY_API_KEY',
    'HALO_CREDENTIAL_POLICY_ENV',
    'HALO_CREDENTIAL_HTTP_HOSTS',
    'HALO_CREDENTIAL_POLICY_ORIGINS',
    'OPENAI_API_KEY',
    'HALO_VLLM_PORT',
  ]) {
    if (saved[k] === undefined) delete process.env[k];
    else process.env[k] = saved[k];
  }
  await new Promise((r) => server.close(r));
});

const policyAt = (baseUrl: string): PolicyConfig => parseConfig({ policy: { baseUrl, model: 'm' } }).policy;
const user = [{ role: 'user' as const, content: 'hi' }];
const leaked = () => seen.some((r) => JSON.stringify(r.headers).includes(SECRET) || r.body.includes(SECRET));

async function rejectsNonRetryable(p: Promise<unknown>, type: string): Promise<ApplicationFailure> {
  const err = await p.then(
    () => assert.fail('expected a failure'),
    (e: unknown) => e,
  );
  assert.ok(err instanceof ApplicationFailure, `not an ApplicationFailure: ${String(err)}`);
  assert.equal(err.type, type);
  assert.equal(err.nonRetryable, true);
  return err;
}

test('a policy input naming an unrelated variable is refused before any request', async () => {
  const before = seen.length;
  // As a credential name (the input bypassed the config schema, as a raw workflow start can).
  const asName = { ...policyAt(`${base}/v1`), credential: 'HALO_PROBE_SECRET' } as unknown as PolicyConfig;
  const e1 = await rejectsNonRetryable(chatCompletions(asName, 1, user), 'UnknownCredential');
  assert.match(e1.message, /policy\.credential "HALO_PROBE_SECRET" is not a credential this worker knows \(one of policy, critic, baseline\)/);
  // As the old apiKeyEnv field.
  const asVar = { ...policyAt(`${base}/v1`), apiKeyEnv: 'HALO_PROBE_SECRET' };
  const e2 = await rejectsNonRetryable(chatCompletions(asVar, 1, user), 'CredentialEnvMismatch');
  assert.match(e2.message, /policy\.credential: policy \| critic \| baseline/);
  assert.match(e2.message, /HALO_POLICY_API_KEY/);
  assert.equal(seen.length, before, 'the server received a request');
  assert.equal(leaked(), false);
});

test('adapter loading and listing refuse an unrelated variable too', async () => {
  const before = seen.length;
  const adapter = { base_url: base, lora_name: 'r-v1', lora_path: '/tmp/r/v1' };
  await rejectsNonRetryable(ensureAdapterLoaded({ ...adapter, api_key_env: 'HALO_PROBE_SECRET' }), 'CredentialEnvMismatch');
  await rejectsNonRetryable(ensureAdapterLoaded({ ...adapter, credential: 'HALO_PROBE_SECRET' as never }), 'UnknownCredential');
  await rejectsNonRetryable(listLoadedAdapters({ base_url: base, api_key_env: 'HALO_PROBE_SECRET' }), 'CredentialEnvMismatch');
  await rejectsNonRetryable(
    ensureAdapters({ base_url: base, adapters: [{ lora_name: 'r-v1', lora_path: '/tmp/r/v1' }], credential: 'HALO_PROBE_SECRET' as never }).then((r) => {
      // ensureAdapters reports non-retryable refusals per adapter: re-raise to check it.
      throw ApplicationFailure.nonRetryable(r.failed[0]?.message ?? 'none failed', /credential/.test(r.failed[0]?.message ?? '') ? 'UnknownCredential' : 'Other');
    }),
    'UnknownCredential',
  );
  assert.equal(seen.length, before, 'the server received a request');
  assert.equal(leaked(), false);
});

test('a named credential is sent to the local server over http; the legacy field naming the same variable is accepted', async () => {
  seen.length = 0;
  await chatCompletions(policyAt(`${base}/v1`), 1, user);
  await chatCompletions({ ...policyAt(`${base}/v1`), apiKeyEnv: 'HALO_POLICY_API_KEY' }, 1, user);
  await listLoadedAdapters({ base_url: base });
  assert.equal(seen.length, 3);
  for (const r of seen) assert.equal(r.headers.authorization, `Bearer ${POLICY_KEY}`);
  assert.equal(leaked(), false);
});

test('a key is never sent over plain http to a host that is not loopback', async () => {
  seen.length = 0;
  for (const url of ['http://10.255.255.1:9/v1', 'http://example.invalid/v1', 'http://169.254.169.254/v1']) {
    const e = await rejectsNonRetryable(chatCompletions(policyAt(url), 1, user), 'CredentialOriginNotAllowed');
    assert.match(e.message, /plain http/);
    await rejectsNonRetryable(listLoadedAdapters({ base_url: url }), 'CredentialOriginNotAllowed');
  }
  assert.equal(seen.length, 0);
});

// The same local server as another origin: `0.0.0.0` reaches it, but is not a loopback name, so no credential
// may go there unless the worker allows that origin.
const foreign = () => base.replace('127.0.0.1', '0.0.0.0');
test('keys are bound to origins: an https URL the credential is not allowed to reach is refused before any request, naming credential, origin and variable', async () => {
  seen.length = 0;
  await withEnv({ OPENAI_API_KEY: 'sk-openai-probe' }, async () => {
    // A workflow input pointing the policy at any https host used to receive HALO_POLICY_API_KEY.
    const e = await rejectsNonRetryable(chatCompletions(policyAt('https://collector.example/v1'), 1, user), 'CredentialOriginNotAllowed');
    assert.match(e.message, /credential "policy" \(HALO_POLICY_API_KEY\) is not sent to https:\/\/collector\.example/);
    assert.match(e.message, /HALO_CREDENTIAL_POLICY_ORIGINS=https:\/\/collector\.example/);
    const baseline = { ...policyAt('https://collector.example:8443/v1'), credential: 'baseline' as const };
    const b = await rejectsNonRetryable(chatCompletions(baseline, 1, user), 'CredentialOriginNotAllowed');
    assert.match(b.message, /credential "baseline" \(OPENAI_API_KEY\) is not sent to https:\/\/collector\.example:8443/);
    assert.match(b.message, /HALO_CREDENTIAL_BASELINE_ORIGINS=/);
    await rejectsNonRetryable(ensureAdapterLoaded({ base_url: 'https://collector.example', lora_name: 'r-v1', lora_path: '/tmp/r/v1' }), 'CredentialOriginNotAllowed');
  });
  assert.equal(seen.length, 0);
});

test('a stand-in server at a non-allowed origin receives nothing, even with the key variable set empty; once allowed, it gets the key', async () => {
  seen.length = 0;
  // Set but empty is still a configured credential: the origin check applies (nothing is sent), as it would with a key.
  await withEnv({ HALO_POLICY_API_KEY: '' }, async () => {
    const e = await rejectsNonRetryable(chatCompletions(policyAt(`${foreign()}/v1`), 1, user), 'CredentialOriginNotAllowed');
    assert.match(e.message, /credential "policy" \(HALO_POLICY_API_KEY\) is not sent to http:\/\/0\.0\.0\.0:\d+/);
    await rejectsNonRetryable(ensureAdapterLoaded({ base_url: foreign(), lora_name: 'r-v1', lora_path: '/tmp/r/v1' }), 'CredentialOriginNotAllowed');
  });
  await rejectsNonRetryable(chatCompletions(policyAt(`${foreign()}/v1`), 1, user), 'CredentialOriginNotAllowed');
  await rejectsNonRetryable(chatCompletions({ ...policyAt(`${foreign()}/v1`), credential: 'critic' }, 1, user, undefined, { field: 'critic' }), 'CredentialOriginNotAllowed');
  assert.equal(seen.length, 0, 'the stand-in server received a request');
  // Unset: nothing to send, so any origin is fine (and no Authorization carries a key).
  await withEnv({ HALO_POLICY_API_KEY: undefined }, async () => {
    await chatCompletions(policyAt(`${foreign()}/v1`), 1, user);
  });
  assert.equal(seen.length, 1);
  assert.equal(seen[0].headers.authorization, 'Bearer EMPTY');
  // Allowed by the worker: the key goes there, for chat, adapter listing and loading.
  seen.length = 0;
  await withEnv({ HALO_CREDENTIAL_POLICY_ORIGINS: ` https://other.example , ${foreign()}/ignored/path ` }, async () => {
    await chatCompletions(policyAt(`${foreign()}/v1`), 1, user);
    await listLoadedAdapters({ base_url: foreign() });
  });
  assert.equal(seen.length, 2);
  for (const r of seen) assert.equal(r.headers.authorization, `Bearer ${POLICY_KEY}`);
});

test('origins: the local server (127.0.0.1 at HALO_VLLM_PORT) for its keys, OpenAI for critic and baseline, the worker adds more, HALO_CREDENTIAL_HTTP_HOSTS at one port', () => {
  const env = { HALO_POLICY_API_KEY: 'k', OPENAI_API_KEY: 'o' };
  const ok = (credential: string, url: string, e: Record<string, string> = env) => resolveCredential({ credential, url, field: 'f', fallback: 'policy' }, e).ok;
  assert.equal(ok('policy', 'http://127.0.0.1:8000/v1'), true);
  assert.equal(ok('policy', 'https://127.0.0.1:8000/v1'), true);
  assert.equal(ok('critic', 'http://127.0.0.1:8000/v1'), true);
  assert.equal(ok('baseline', 'http://127.0.0.1:8000/v1'), false, "the OpenAI key is not the local server's");
  for (const other of ['http://127.0.0.1:8001/v1', 'https://localhost:9/v1', 'http://localhost:8000/v1', 'http://[::1]:8000/v1', 'http://127.0.0.2:8000/v1']) {
    assert.equal(ok('policy', other), false, `${other}: another socket than the local server's`);
  }
  assert.equal(ok('policy', 'http://127.0.0.1:8001/v1', { ...env, HALO_VLLM_PORT: '8001' }), true);
  assert.equal(ok('policy', 'http://127.0.0.1:8000/v1', { ...env, HALO_VLLM_PORT: '8001' }), false);
  assert.equal(ok('policy', 'http://127.0.0.1:8000/v1', { ...env, HALO_VLLM_PORT: 'eighty' }), true, 'a port that is not a number: the default');
  assert.equal(ok('policy', 'https://api.openai.com/v1'), false);
  assert.equal(ok('critic', 'https://api.openai.com/v1'), true);
  assert.equal(ok('baseline', 'https://API.OpenAI.com:443/v1'), true);
  assert.equal(ok('baseline', 'http://api.openai.com/v1'), false, 'another scheme is another origin');
  assert.equal(ok('baseline', 'https://api.openai.com:8443/v1'), false, 'another port is another origin');
  assert.equal(ok('baseline', 'https://api.openai.com.evil.example/v1'), false);
  assert.equal(ok('baseline', 'https://user@evil.example/v1'), false);
  const more = { ...env, HALO_CREDENTIAL_POLICY_ORIGINS: 'https://gpu.example:8443,not a url', HALO_CREDENTIAL_HTTP_HOSTS: 'vllm, gpu-box:9000, bad/path' };
  assert.equal(ok('policy', 'https://gpu.example:8443/v1', more), true);
  assert.equal(ok('policy', 'https://gpu.example/v1', more), false);
  assert.equal(ok('critic', 'https://gpu.example:8443/v1', more), false, 'origins are per credential');
  assert.equal(ok('policy', 'http://vllm:8000/v1', more), true);
  assert.equal(ok('critic', 'http://vllm:8000/v1', more), true);
  assert.equal(ok('policy', 'http://vllm:8001/v1', more), false, 'a host of HALO_CREDENTIAL_HTTP_HOSTS at another port');
  assert.equal(ok('policy', 'http://gpu-box:9000/v1', more), true);
  assert.equal(ok('policy', 'http://gpu-box:8000/v1', more), false);
  assert.equal(ok('baseline', 'http://vllm:8000/v1', more), false, 'the OpenAI key does not go to the local server');
  assert.equal(ok('policy', 'ftp://127.0.0.1/v1'), false);
  // The variable set to an empty string is configured (checked); unset is not (nothing is sent).
  assert.equal(ok('policy', 'https://x.example/v1', { HALO_POLICY_API_KEY: '' }), false);
  assert.equal(ok('policy', 'https://x.example/v1', {}), true);
  assert.equal(ok('baseline', 'https://x.example/v1', { HALO_CREDENTIAL_BASELINE_ENV: 'MINE', MINE: '' }), false);
});

test('a listener on a random loopback port never receives a key, the OpenAI key included, whatever the workflow input says', async () => {
  const squatted: { headers: IncomingMessage['headers']; body: string }[] = [];
  const squatter = createServer((req, res) => {
    let body = '';
    req.on('data', (c: Buffer) => (body += c.toString('utf8')));
    req.on('end', () => {
      squatted.push({ headers: req.headers, body });
      res.setHeader('content-type', 'application/json');
      res.end(
        JSON.stringify({
          id: 'x',
          object: 'chat.completion',
          created: 0,
          model: 'm',
          choices: [{ index: 0, finish_reason: 'stop', message: { role: 'assistant', content: 'ok' } }],
        }),
      );
    });
  });
  await new Promise<void>((r) => squatter.listen(0, '127.0.0.1', r));
  const at = `http://127.0.0.1:${(squatter.address() as AddressInfo).port}`;
  const OPENAI = 'sk-openai-squatter-probe';
  try {
    await withEnv({ OPENAI_API_KEY: OPENAI }, async () => {
      // A workflow started with `policy.credential: baseline` and the squatter's port as its base URL.
      const e = await rejectsNonRetryable(chatCompletions({ ...policyAt(`${at}/v1`), credential: 'baseline' }, 1, user), 'CredentialOriginNotAllowed');
      assert.match(
        e.message,
        new RegExp(
          `credential "baseline" \\(OPENAI_API_KEY\\) is not sent to ${at.replace(/[.]/g, '\\.')}.*allowed: https://api\\.openai\\.com\\).*loopback address is no exception`,
        ),
      );
      // Nor to the local vLLM's own port: that server gets its own key, never OpenAI's.
      await rejectsNonRetryable(chatCompletions({ ...policyAt(`${base}/v1`), credential: 'baseline' }, 1, user), 'CredentialOriginNotAllowed');
      // The local server's keys, at any port but the one the operator gave.
      for (const credential of ['policy', 'critic'] as const) {
        const p = await rejectsNonRetryable(chatCompletions({ ...policyAt(`${at}/v1`), credential }, 1, user), 'CredentialOriginNotAllowed');
        assert.match(p.message, /only at the local server's origin \(http:\/\/127\.0\.0\.1:\d+; HALO_VLLM_PORT sets the port\)/);
      }
      await rejectsNonRetryable(ensureAdapterLoaded({ base_url: at, lora_name: 'r-v1', lora_path: '/tmp/r/v1' }), 'CredentialOriginNotAllowed');
      await rejectsNonRetryable(listLoadedAdapters({ base_url: `${at}/v1` }), 'CredentialOriginNotAllowed');
    });
    assert.equal(squatted.length, 0, 'the listener on a random loopback port received a request');
    // Configured by the operator on the worker's side, the same origin gets the key: the probe sees what is sent.
    await withEnv({ OPENAI_API_KEY: OPENAI, HALO_CREDENTIAL_BASELINE_ORIGINS: at }, async () => {
      await chatCompletions({ ...policyAt(`${at}/v1`), credential: 'baseline' }, 1, user);
    });
    assert.equal(squatted.length, 1);
    assert.equal(squatted[0].headers.authorization, `Bearer ${OPENAI}`);
  } finally {
    await new Promise((r) => squatter.close(r));
  }
});

test('error bodies are clipped before they go into failures (and histories)', async () => {
  const long = 'E'.repeat(5000);
  const bad = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.statusCode = 400;
      if (req.url?.endsWith('/chat/completions')) {
        res.setHeader('content-type', 'application/json');
        res.end(JSON.stringify({ error: { message: long, type: 'BadRequestError' } }));
      } else res.end(long);
    });
  });
  await new Promise<void>((r) => bad.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(bad.address() as AddressInfo).port}`;
  const port = process.env.HALO_VLLM_PORT;
  process.env.HALO_VLLM_PORT = String((bad.address() as AddressInfo).port);
  try {
    const e = await rejectsNonRetryable(chatCompletions(policyAt(`${url}/v1`), 1, user), 'PolicyRequestRejected');
    assert.ok(e.message.length < 600, `policy failure message of ${e.message.length} characters`);
    assert.ok(JSON.stringify(e.details).length < 600, 'policy failure details too long');
    assert.match(e.message, /more characters\)/);
    const a = await rejectsNonRetryable(ensureAdapterLoaded({ base_url: url, lora_name: 'r-v1', lora_path: '/tmp/r/v1' }), 'VllmAdapterRejected');
    assert.ok(a.message.length < 600, `adapter failure message of ${a.message.length} characters`);
    assert.ok(JSON.stringify(a.details).length < 600, 'adapter failure details too long');
  } finally {
    process.env.HALO_VLLM_PORT = port;
    await new Promise((r) => bad.close(r));
  }
});

test('the worker alone maps names to variables and allows plain-http hosts', () => {
  const env = { HALO_POLICY_API_KEY: 'k', OPENAI_API_KEY: 'o', MINE: 'm', HALO_CREDENTIAL_BASELINE_ENV: 'MINE', HALO_CREDENTIAL_HTTP_HOSTS: 'vllm, gpu-box' };
  assert.equal(credentialEnvVar('policy', env), 'HALO_POLICY_API_KEY');
  assert.equal(credentialEnvVar('critic', env), 'HALO_POLICY_API_KEY');
  assert.equal(credentialEnvVar('baseline', env), 'MINE');
  const r = (credential: unknown, url: string, apiKeyEnv?: string) => resolveCredential({ credential, apiKeyEnv, url, field: 'policy', fallback: 'policy' }, env);
  assert.deepEqual(r('baseline', 'https://api.openai.com/v1'), { ok: true, name: 'baseline', envVar: 'MINE', key: 'm' });
  assert.equal(r('policy', 'http://vllm:8000/v1').ok, true);
  assert.equal(r('policy', 'http://GPU-BOX:8000/v1').ok, true);
  assert.equal(r('policy', 'http://127.0.0.1:8000/v1').ok, true);
  // Loopback names of other sockets than the one the local server binds.
  assert.equal(r('policy', 'http://[::1]:8000/v1').ok, false);
  assert.equal(r('policy', 'http://localhost:8000/v1').ok, false);
  assert.equal(r('policy', 'http://127.3.0.1:8000/v1').ok, false);
  assert.equal(r('policy', 'http://127.0.0.1.nip.io:8000/v1').ok, false);
  assert.equal(r('policy', 'http://vllm.evil:8000/v1').ok, false);
  assert.equal(r(undefined, 'http://10.0.0.1/v1', undefined).ok, false);
  // No key set: nothing is sent, so any URL is fine.
  assert.equal(resolveCredential({ credential: 'policy', url: 'http://10.0.0.1/v1', field: 'policy', fallback: 'policy' }, {}).ok, true);
  assert.equal(r('baseline', 'https://x/v1', 'OPENAI_API_KEY').ok, false, 'OPENAI_API_KEY is not what this worker maps baseline to');
  assert.equal(r('baseline', 'https://api.openai.com/v1', 'MINE').ok, true);
  assert.equal(r('baseline', 'https://x/v1', 'MINE').ok, false, 'https alone is not enough: the origin must be allowed');
  for (const bad of ['PATH', 'HOME', 'policy ', 'Policy', '', 42]) assert.equal(r(bad, 'https://x/v1').ok, false, String(bad));
});
