import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Client } from '@temporalio/client';
import { ensureAdapterLoaded } from '../../activities/adapters';
import { retentionArgs, retentionNeeds } from '../../client/commands/gc';
import { learnerCommand } from '../../client/processes';
import { freePort } from '../../client/temporal-server';
import { writeAdapterFolder } from '../../testing/adapter-folder';
import { startFakeVllmServer, type FakeVllmServer } from '../../testing/fake-vllm-server';

// A run that has ended leaves its last adapter loaded in vLLM. `halo gc --run R --keep-last 1 --delete` must keep
// the version vLLM serves (GET /v1/models), whatever Temporal says, or the next reload of it finds no folder.

let vllm: FakeVllmServer;
let root: string;

before(async () => {
  root = mkdtempSync(join(tmpdir(), 'halo-gc-served-'));
  vllm = await startFakeVllmServer();
});
after(async () => {
  await vllm?.close();
  rmSync(root, { recursive: true, force: true });
});

/** A Temporal namespace with no open workflow: the run has ended. */
const noOpenWorkflows = {
  options: { namespace: 'default' },
  workflow: { list: () => (async function* () {})() },
} as unknown as Client;

test('retention keeps the version a configured vLLM serves, after the run ended; a vLLM that is down serves nothing', async () => {
  for (const v of [1, 2, 3, 4]) writeAdapterFolder(root, 'ended', v);
  await ensureAdapterLoaded({ base_url: vllm.url, lora_name: 'ended-v2', lora_path: join(root, 'ended', 'v2') });
  await ensureAdapterLoaded({ base_url: vllm.url, lora_name: 'ended-other-v3', lora_path: join(root, 'ended', 'v3') });
  const said: string[] = [];
  const down = `http://127.0.0.1:${await freePort()}`;
  const needs = await retentionNeeds(noOpenWorkflows, 'ended', [`${vllm.url}/v1`, `${down}/v1`], (m) => said.push(m));
  assert.deepEqual(needs.versions, [2]);
  assert.deepEqual(needs.reasons, [`v2: vLLM at ${vllm.url} serves it as ended-v2`]);
  assert.deepEqual(said, [`vLLM at ${down} is not running: it serves no adapter now`]);

  const args = retentionArgs({ run: 'ended', keepLast: '1', keepEvery: '0', delete: true }, needs);
  const { command, env } = learnerCommand();
  const r = spawnSync(command, [...args, '--root', root], { env, encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  assert.deepEqual(
    [1, 2, 3, 4].map((v) => existsSync(join(root, 'ended', `v${v}`))),
    [false, true, false, true],
  );
});

test('a vLLM that answers with an error leaves what it serves unknown: nothing is changed', async () => {
  const failing = await startFakeVllmServer();
  try {
    failing.failNext(503, 3);
    await assert.rejects(
      retentionNeeds(noOpenWorkflows, 'ended', [failing.url], () => {}),
      /could not ask vLLM at .* which adapters it serves, so nothing was changed: .*HTTP 503/,
    );
  } finally {
    await failing.close();
  }
});
