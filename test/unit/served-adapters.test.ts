import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Client } from '@temporalio/client';
import { reloadServedAdapters } from '../../client/served-adapters';
import { withEnv } from '../helpers/with-env';

// `halo up` reloads the adapter each running training run reports in its status. That status is written by
// whoever started the workflow: its URL gets the policy key only when the origin is allowed for it.

/** A client whose one running training run reports `servedAdapter`. */
function clientWith(servedAdapter: Record<string, unknown>): Client {
  return {
    workflow: {
      list: async function* () {
        yield { workflowId: 'run-a' };
      },
      getHandle: () => ({ query: async () => ({ servedAdapter }) }),
    },
  } as unknown as Client;
}

test('halo up: an adapter URL from a run status gets no key unless its origin is allowed; allowed, it is loaded with the key', async () => {
  const seen: { url: string; headers: IncomingMessage['headers'] }[] = [];
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      seen.push({ url: req.url ?? '', headers: req.headers });
      res.setHeader('content-type', 'application/json');
      res.end(req.url?.endsWith('/models') ? JSON.stringify({ object: 'list', data: [] }) : '"Success"');
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as AddressInfo).port;
  // `0.0.0.0` reaches the stand-in server but is not loopback by name: another origin.
  const foreign = `http://0.0.0.0:${port}`;
  const adapter = { base_url: foreign, lora_name: 'run-a-v3', lora_path: '/tmp/run-a/v3' };
  const said: string[] = [];
  try {
    await withEnv(
      { HALO_POLICY_API_KEY: 'policy-key-up', HALO_CREDENTIAL_POLICY_ENV: undefined, HALO_CREDENTIAL_POLICY_ORIGINS: undefined, HALO_CREDENTIAL_HTTP_HOSTS: undefined },
      async () => {
        const r = await reloadServedAdapters(clientWith(adapter), (m) => said.push(m));
        assert.deepEqual(r, { loaded: [], present: [], failed: ['run-a-v3'] });
        assert.equal(seen.length, 0, 'the stand-in server received a request');
        assert.match(
          said.join('\n'),
          new RegExp(
            `not loading adapter run-a-v3 of run run-a: .*credential "policy" \\(HALO_POLICY_API_KEY\\) is not sent to ${foreign}.*HALO_CREDENTIAL_POLICY_ORIGINS=${foreign}`,
          ),
        );
        // A set but empty key is checked the same way.
        process.env.HALO_POLICY_API_KEY = '';
        assert.deepEqual((await reloadServedAdapters(clientWith(adapter), (m) => said.push(m))).failed, ['run-a-v3']);
        assert.equal(seen.length, 0);
        // Extra fields of the status (a variable to read) are not passed on.
        process.env.HALO_POLICY_API_KEY = 'policy-key-up';
        process.env.HALO_CREDENTIAL_POLICY_ORIGINS = foreign;
        process.env.HALO_PROBE_SECRET_UP = 'probe-secret-up';
        const r2 = await reloadServedAdapters(clientWith({ ...adapter, api_key_env: 'HALO_PROBE_SECRET_UP', credential: 'baseline' }), (m) => said.push(m));
        delete process.env.HALO_PROBE_SECRET_UP;
        assert.deepEqual(r2, { loaded: ['run-a-v3'], present: [], failed: [] });
        assert.ok(seen.length > 0);
        for (const s of seen) assert.equal(s.headers.authorization, 'Bearer policy-key-up');
      },
    );
  } finally {
    await new Promise((r) => server.close(r));
  }
});
