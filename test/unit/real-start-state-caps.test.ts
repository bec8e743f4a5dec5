import { test } from 'node:test';
import assert from 'node:assert/strict';
import { MAX_REFUSED_START_STATES, RealStartStates } from '../../activities/real-start-states';
import type { ClientSnapshot } from '../../env/real-snapshot';

// A browser worker keeps REAL start states in memory: bounded by bytes, not only by count, and the list of tasks
// whose copies were refused cannot grow without bound over a long run of many tasks.

const snap = (kb: number): ClientSnapshot => ({
  storage: { cookies: [], origins: [{ origin: 'https://site.example', localStorage: [{ name: 'persist:root', value: 'x'.repeat(kb * 1024) }] }] },
  sessionStorage: {},
  url: 'https://site.example/',
  steps: 0,
  finish: '{}',
});

test('kept start states stay under the byte cap: the oldest go first, one alone over the cap is not kept', () => {
  const states = new RealStartStates(32, 60_000, 4 * 1024);
  states.put('a', snap(1), 0);
  states.put('b', snap(1), 1);
  states.put('c', snap(1), 2);
  assert.equal(states.size, 3);
  states.put('d', snap(1), 3);
  assert.ok(states.bytes <= states.maxBytes, `${states.bytes} bytes kept, over ${states.maxBytes}`);
  assert.equal(states.get('a', 4), undefined);
  assert.ok(states.get('d', 4));
  states.put('huge', snap(8), 5);
  assert.equal(states.get('huge', 6), undefined);
  assert.ok(states.bytes <= states.maxBytes);
  assert.throws(() => new RealStartStates(32, 60_000, 0), /byte cap must be a whole number > 0, got 0/);
});

test('the refusal list is bounded; the newest refusals are the ones kept', () => {
  const states = new RealStartStates(32, 60 * 60_000);
  const n = MAX_REFUSED_START_STATES + 500;
  for (let i = 0; i < n; i++) states.refuse(`task-${i}`, i);
  assert.ok(states.refusedCount <= MAX_REFUSED_START_STATES, `${states.refusedCount} refusals remembered`);
  // The newest is still refused: no copy of it is wanted.
  assert.equal(states.wants(`task-${n - 1}`, n), false);
});
