import { test } from 'node:test';
import assert from 'node:assert/strict';
import { evalSizeProblem, MAX_EVAL_EPISODES } from '../../lib/eval/eval-types';

test('modes × tasks × seeds is checked before anything runs, and the message says what to lower', () => {
  assert.equal(evalSizeProblem({ modes: 4, tasks: 125, seeds: 200 }), null);
  assert.equal(evalSizeProblem({ modes: 1, tasks: 1, seeds: MAX_EVAL_EPISODES }), null);
  assert.match(
    evalSizeProblem({ modes: 4, tasks: 125, seeds: 201 })!,
    /4 × 125 × 201 = 100500 episodes, more than one evaluation runs \(100000\): use fewer seeds, tasks or modes/,
  );
  assert.equal(evalSizeProblem({ modes: 1, tasks: 1, seeds: 1, continueAsNewEvery: 3 }), null);
  for (const bad of [0, -1, 2.5, 1e9]) assert.match(evalSizeProblem({ modes: 1, tasks: 1, seeds: 1, continueAsNewEvery: bad })!, /continueAsNewEvery/);
});
