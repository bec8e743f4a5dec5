import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseConfig, parseStoredConfig } from '../../lib/config/config';
import { EVENTS_PER_CHILD, iterationFootprint, TEMPORAL_LIMITS } from '../../lib/config/history-budget';
import { configRefusal } from '../helpers/config-refusal';

const HISTORIES = join(__dirname, '..', 'fixtures', 'histories');

test('the footprint of an iteration, by hand', () => {
  // 10 episodes + 2 × 3 evaluation episodes = 16 children of up to 5 actions:
  //   events = 60 + 6 × 20 + 9 × 16 = 324
  //   bytes  = 262144 + 16 × (8192 + 256 × 5) = 262144 + 151552 = 413696
  assert.deepEqual(iterationFootprint({ collect: 10, evaluate: 3, evaluations: 2, actionsPerChild: 5 }), { children: 16, events: 324, historyBytes: 413696 });
});

test('the bound holds for the recorded training iterations (events and bytes)', () => {
  let checked = 0;
  for (const file of readdirSync(HISTORIES).filter((f) => f.endsWith('.json'))) {
    const text = readFileSync(join(HISTORIES, file), 'utf8');
    const events = (JSON.parse(text) as { events: Record<string, unknown>[] }).events;
    const type = (events[0].workflowExecutionStartedEventAttributes as { workflowType: { name: string } }).workflowType.name;
    if (type !== 'trainGrpo' && type !== 'trainMcts') continue;
    const children = events.filter((e) => e.startChildWorkflowExecutionInitiatedEventAttributes).length;
    const childEvents = events.filter((e) => /CHILD_WORKFLOW/.test(String(e.eventType))).length;
    assert.equal(childEvents, 3 * children, `${file}: initiated, started, completed per child`);
    const bound = iterationFootprint({ collect: children, evaluate: 0, evaluations: 1, actionsPerChild: 1 });
    // The JSON text (payloads in base64) is larger than what the server counts: a fair upper bound to compare with.
    assert.ok(events.length <= bound.events, `${file}: ${events.length} events, bound ${bound.events}`);
    assert.ok(text.length <= bound.historyBytes, `${file}: ${text.length} bytes, bound ${bound.historyBytes}`);
    checked++;
  }
  assert.ok(checked >= 4, `checked ${checked} training histories`);
});

test("a GRPO iteration whose child workflows would pass the run's history limit is refused, naming the fields", () => {
  // The schema's largest fan-out: 256 tasks × 64 rollouts = 16,384 episodes, about 147,000 events (ten-step episodes: bytes let ~4,850 fit).
  const msg = configRefusal({ train: { grouping: 'episode', episodesPerIteration: 256, numGenerations: 64 } });
  assert.match(
    msg,
    /train\.episodesPerIteration 256 × train\.numGenerations 64 \(episode grouping\) = 16384 child workflows: one iteration's history reaches 147636 events, over Temporal's 51200; about 4851 children fit: lower train\.episodesPerIteration or train\.numGenerations/,
  );
  // 256 × 16 = 4,096 episodes fit; step grouping runs one episode per task whatever N is.
  assert.doesNotThrow(() => parseConfig({ train: { grouping: 'episode', episodesPerIteration: 256, numGenerations: 16 } }));
  assert.doesNotThrow(() => parseConfig({ train: { grouping: 'step', episodesPerIteration: 256, numGenerations: 8 } }));
  // Evaluation episodes count too: 1,000 held-out tasks × 1,000 seeds, twice when pipelined.
  const tasks = Array.from({ length: 1000 }, (_, i) => `task-${i}`);
  const seeds = Array.from({ length: 1000 }, (_, i) => i);
  assert.match(
    configRefusal({ train: { heldOutTasks: tasks, evalSeeds: seeds, evalEvery: 1, maxStaleness: 1 } }),
    /\+ 2 × train\.heldOutTasks 1000 × train\.evalSeeds 1000 = 1000000 evaluation episodes: .* lower train\.heldOutTasks or train\.evalSeeds \(or train\.episodesPerIteration\)/,
  );
  // Without evaluation those held-out tasks cost nothing.
  assert.doesNotThrow(() => parseConfig({ train: { heldOutTasks: tasks, evalSeeds: seeds, evalEvery: 0 } }));
  // Long episodes fill the bytes first: each child's result lists up to episode.maxSteps actions.
  assert.match(
    configRefusal({ episode: { maxSteps: 200 }, train: { grouping: 'episode', episodesPerIteration: 256, numGenerations: 4 } }),
    /= 1024 child workflows: one iteration's history reaches [0-9.]+ MiB, over Temporal's 50\.0 MiB; about \d+ children fit/,
  );
  assert.equal(TEMPORAL_LIMITS.historyEvents, 51_200);
  assert.equal(EVENTS_PER_CHILD, 9);
});

test('an MCTS iteration with too many searches or evaluation episodes is refused; a stored config still loads', () => {
  const tasks = Array.from({ length: 200 }, (_, i) => `task-${i}`);
  assert.match(
    configRefusal({ mcts: { tasks, searchesPerTask: 64 } }),
    /mcts\.tasks 200 × mcts\.searchesPerTask 64 = 12800 child workflows: .* lower mcts\.tasks or mcts\.searchesPerTask$/m,
  );
  assert.match(
    configRefusal({ mcts: { evalEvery: 1, evalSeeds: Array.from({ length: 1000 }, (_, i) => i), tasks: tasks.slice(0, 10) } }),
    /mcts\.tasks \(no heldOutTasks\) 10 × mcts\.evalSeeds 1000 = 10000 evaluation episodes: .* lower mcts\.evalSeeds/,
  );
  assert.doesNotThrow(() => parseConfig({ mcts: { tasks, searchesPerTask: 8 } }));
  // A run started before the check replays from its stored config (the check is for new runs).
  assert.equal(parseStoredConfig({ mcts: { tasks, searchesPerTask: 64 } }).cfg.mcts.searchesPerTask, 64);
});
