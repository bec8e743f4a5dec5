import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { learnerModelFor, recordLearnerModel, recordedLearnerModel } from '../../client/learner-record';

test('after a restart, the learner comes back with the model it ran, unless HALO_MODEL says otherwise', () => {
  const home = mkdtempSync(join(tmpdir(), 'halo-learner-record-'));
  try {
    assert.equal(recordedLearnerModel(home), undefined);
    assert.equal(learnerModelFor(home, 'tiny-random', {}), 'tiny-random', 'nothing recorded: the default');
    recordLearnerModel(home, 'Qwen/Qwen3-VL-8B-Instruct');
    assert.equal(learnerModelFor(home, 'tiny-random', {}), 'Qwen/Qwen3-VL-8B-Instruct', 'not the tiny local default');
    assert.equal(learnerModelFor(home, 'tiny-random', { HALO_MODEL: 'other/model' }), 'other/model');
  } finally {
    rmSync(home, { recursive: true, force: true });
  }
});
