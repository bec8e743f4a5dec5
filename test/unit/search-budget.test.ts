import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ConfigError, parseConfig, parseStoredConfig } from '../../lib/config/config';
import { TEMPORAL_LIMITS } from '../../lib/config/history-budget';
import { BYTES_PER_NODE, searchFootprint, type SearchShape } from '../../lib/config/search-budget';
import { configRefusal } from '../helpers/config-refusal';

const HISTORIES = join(__dirname, '..', 'fixtures', 'histories');

test('the footprint of a small search, by hand', () => {
  // 10 simulations × K 3: 31 nodes; one simulation: 4 + 2 + 0 + 6 + 16 = 28 activities, 168 events;
  // bytes: 4 × 256 + 3 × 3 × 1536 + 4 × (2 × 1536 + 4096) + 40960 = 1024 + 13824 + 28672 + 40960 = 84480.
  const f = searchFootprint({ numSimulations: 10, maxChildren: 3, maxDepth: 4, continueAsNewEvery: 5, parkedSessions: 0, maxTokens: 64 });
  assert.deepEqual(f, {
    treeNodes: 31,
    treeBytes: 31 * 2048,
    simulationEvents: 168,
    simulationBytes: 84480,
    // 40 + 2 × 6 × (1 chunk + manifest) + min(5 × 168, 4096 + 168)
    runEvents: 40 + 24 + 840,
    // 131072 + 2 × 63488 + min(5 × 84480, 4 MiB + 84480)
    runBytes: 131072 + 126976 + 422400,
    chunkBytes: 31 * 2048,
  });
});

test('the bound holds for the recorded search histories (events, bytes, bytes per snapshot node)', () => {
  let checked = 0;
  for (const file of readdirSync(HISTORIES).filter((f) => f.endsWith('.json'))) {
    const text = readFileSync(join(HISTORIES, file), 'utf8');
    const events = (JSON.parse(text) as { events: Record<string, Record<string, unknown>>[] }).events;
    const started = events[0].workflowExecutionStartedEventAttributes as { workflowType: { name: string }; input: { payloads: { data: string }[] } };
    if (started.workflowType.name !== 'mctsSearch') continue;
    const input = JSON.parse(Buffer.from(started.input.payloads[0].data, 'base64').toString('utf8'));
    const shape: SearchShape = { ...input.params, parkedSessions: input.params.parkedSessions ?? 0, maxTokens: input.policy.maxTokens };
    const f = searchFootprint(shape);
    // The JSON text (payloads in base64) is larger than what the server counts: a fair upper bound to compare with.
    assert.ok(events.length <= f.runEvents, `${file}: ${events.length} events, bound ${f.runEvents}`);
    assert.ok(text.length <= f.runBytes, `${file}: ${text.length} bytes, bound ${f.runBytes}`);
    for (const e of events) {
      const a = e.activityTaskScheduledEventAttributes as { activityType: { name: string }; input: { payloads: { data: string }[] } } | undefined;
      if (a?.activityType.name !== 'storeJson') continue;
      const { value } = JSON.parse(Buffer.from(a.input.payloads[0].data, 'base64').toString('utf8'));
      if (!Array.isArray(value?.nodes)) continue;
      const perNode = JSON.stringify(value).length / value.nodes.length;
      assert.ok(perNode <= BYTES_PER_NODE, `${file}: ${perNode} bytes per snapshot node, bound ${BYTES_PER_NODE}`);
      assert.ok(value.nodes.length <= f.treeNodes, `${file}: ${value.nodes.length} nodes, bound ${f.treeNodes}`);
    }
    checked++;
  }
  assert.ok(checked >= 3, `checked ${checked} search histories`);
});

const LARGEST = { numSimulations: 10_000, maxChildren: 32, maxDepth: 200, continueAsNewEvery: 1000, parkedSessions: 8 };

test("the schema's largest MCTS settings are refused, naming what to lower", () => {
  const msg = configRefusal({ mcts: LARGEST, policy: { maxTokens: 1024 } });
  assert.match(
    msg,
    /mcts\.numSimulations 10000 × mcts\.maxChildren 32: a search's tree grows to 320001 nodes .* over Temporal's 50\.0 MiB: lower mcts\.numSimulations or mcts\.maxChildren/,
  );
  // A long rollout of long completions fills one simulation's history on its own, whatever the tree.
  const rollout = configRefusal({ mcts: { numSimulations: 10, maxChildren: 2, maxDepth: 200 }, policy: { maxTokens: 8192 } });
  assert.match(
    rollout,
    /mcts\.maxDepth 200 × policy\.maxTokens 8192 \(mcts\.maxChildren 2\): .*one simulation writes up to 51\.\d MiB.*: lower mcts\.maxDepth or policy\.maxTokens/,
  );
  assert.doesNotMatch(rollout, /lower mcts\.numSimulations/);
  // A run that started under the old rules still loads its stored config.
  assert.equal(parseStoredConfig({ mcts: LARGEST }).cfg.mcts.numSimulations, 10_000);
});

test('every MCTS setting the config accepts, up to the largest, keeps a search run under the history limits', () => {
  const L = TEMPORAL_LIMITS;
  let accepted = 0;
  let refused = 0;
  for (const numSimulations of [1, 50, 500, 1000, 2500, 5000, 10_000])
    for (const maxChildren of [1, 5, 32])
      for (const maxDepth of [6, 50, 200])
        for (const maxTokens of [256, 2048, 8192])
          for (const continueAsNewEvery of [1, 10, 1000]) {
            const mcts = { numSimulations, maxChildren, maxDepth, continueAsNewEvery, parkedSessions: 8 };
            let ok = true;
            try {
              parseConfig({ mcts, policy: { maxTokens } });
            } catch (err) {
              assert.ok(err instanceof ConfigError && /mcts\.|policy\.maxTokens/.test(err.message), String(err));
              ok = false;
            }
            if (!ok) {
              refused++;
              continue;
            }
            accepted++;
            const f = searchFootprint({ ...mcts, maxTokens });
            const where = JSON.stringify({ ...mcts, maxTokens });
            assert.ok(f.runBytes <= L.historyBytes, `${where}: ${f.runBytes} bytes`);
            assert.ok(f.runEvents <= L.historyEvents, `${where}: ${f.runEvents} events`);
            assert.ok(f.chunkBytes <= L.payloadBytes, `${where}: a chunk of ${f.chunkBytes} bytes`);
          }
  // Both sides of the line are exercised: the largest accepted settings, and the schema's own maxima refused.
  assert.ok(accepted > 50 && refused > 50, `${accepted} accepted, ${refused} refused`);
  assert.doesNotThrow(() => parseConfig({ mcts: { ...LARGEST, maxChildren: 1, numSimulations: 5000 }, policy: { maxTokens: 2048 } }));
});
