import assert from 'node:assert/strict';
import { test } from 'node:test';
import { DEFAULT_WARM_PAGES, WarmPages, warmKey, warmPagesFromEnv } from '../../activities/warm-pages';

test('a kept page serves starts of its task with the same time limit and reward mode, any seed; REAL never', () => {
  const k = warmKey({ env: 'miniwob', task: 'click-test', seed: 1 }, undefined);
  assert.equal(warmKey({ env: 'miniwob', task: 'click-test', seed: 99 }, {}), k, 'the seed and unset options do not matter');
  assert.equal(warmKey({ env: 'miniwob', task: 'click-test', seed: 1 }, { miniwobTimeLimit: 'raised', miniwobReward: 'raw' }), k, 'the defaults spelled out');
  assert.notEqual(warmKey({ env: 'miniwob', task: 'focus-text', seed: 1 }, undefined), k);
  assert.notEqual(warmKey({ env: 'miniwob', task: 'click-test', seed: 1 }, { miniwobTimeLimit: 'official' }), k);
  assert.notEqual(warmKey({ env: 'miniwob', task: 'click-test', seed: 1 }, { miniwobReward: 'official' }), k);
  assert.equal(warmKey({ env: 'real', task: 'v2.omnizon-1', seed: 0 }, undefined), undefined);
});

test('HALO_WARM_PAGES: unset is the default, 0 turns the pool off, anything else but a whole number is an error', () => {
  assert.equal(warmPagesFromEnv(undefined), DEFAULT_WARM_PAGES);
  assert.equal(warmPagesFromEnv(''), DEFAULT_WARM_PAGES);
  assert.equal(warmPagesFromEnv('0'), 0);
  assert.equal(warmPagesFromEnv('32'), 32);
  for (const bad of ['-1', '2.5', 'many']) assert.throws(() => warmPagesFromEnv(bad), /HALO_WARM_PAGES must be a whole number >= 0/);
  assert.throws(() => new WarmPages(-1, 1000), /whole number/);
});
