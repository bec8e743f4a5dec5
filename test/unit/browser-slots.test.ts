import { test } from 'node:test';
import assert from 'node:assert/strict';
import { browserSlots } from '../../workers/browser-slots';

test('browser worker slots: both queues carry an explicit cap (the SDK would allow 100 activities each)', () => {
  assert.deepEqual(browserSlots({}), { shared: { maxConcurrentActivityTaskExecutions: 4 }, own: { maxConcurrentActivityTaskExecutions: 16 } });
  // The own queue follows the session cap unless set.
  assert.deepEqual(browserSlots({ HALO_MAX_SESSIONS: '2' }).own, { maxConcurrentActivityTaskExecutions: 8 });
  assert.deepEqual(browserSlots({ HALO_MAX_SESSIONS: '2', HALO_SESSION_SLOTS: '5' }), {
    shared: { maxConcurrentActivityTaskExecutions: 2 },
    own: { maxConcurrentActivityTaskExecutions: 5 },
  });
});

test('browser worker slots: a bad value is an error naming the variable', () => {
  for (const [key, value] of [
    ['HALO_MAX_SESSIONS', '0'],
    ['HALO_MAX_SESSIONS', 'four'],
    ['HALO_SESSION_SLOTS', '2.5'],
    ['HALO_SESSION_SLOTS', '-1'],
  ]) {
    assert.throws(() => browserSlots({ [key]: value }), new RegExp(`^Error: ${key} must be a whole number from 1 to 10000 .*got "${value}"$`));
  }
});
