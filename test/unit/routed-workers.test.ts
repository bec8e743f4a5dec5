import { test } from 'node:test';
import assert from 'node:assert/strict';
import { runOf } from '../helpers/routed-workers';

// The workflow tests' shared workers route an activity by its workflow id: a wrong route would hand one test's
// activities to another test's mocks.

test("a workflow belongs to the run it is, or whose id and a '-' it starts with; the longest such run wins", () => {
  const runs = ['grpo-1', 'grpo-1-x', 'grpo-12'];
  assert.equal(runOf('grpo-1', runs), 'grpo-1');
  assert.equal(runOf('grpo-1-it2-ep3', runs), 'grpo-1');
  assert.equal(runOf('grpo-1-x-it1-ep0', runs), 'grpo-1-x');
  assert.equal(runOf('grpo-12-it1-eval0', runs), 'grpo-12');
  assert.equal(runOf('grpo-123', runs), undefined, 'a longer id is another run');
  assert.equal(runOf('grpo-1x', runs), undefined);
  assert.equal(runOf('other', runs), undefined);
  assert.equal(runOf('grpo-1', []), undefined);
});
