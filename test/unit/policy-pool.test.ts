import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ConfigError } from '../../lib/config/config-error';
import { parseConfig } from '../../lib/config/config';
import { applyRunOverrides } from '../../client/config-overrides';
import { DRAIN_FIRST_MS, DRAIN_MAX_MS, policyReplicas, ReplicaPool } from '../../lib/serving/policy-pool';

const A = 'http://a:8000/v1';
const B = 'http://b:8000/v1';
const C = 'http://c:8000/v1';

test('an idle pool spreads requests over every replica; a busy one sends the next to the fewest in flight', () => {
  const pool = new ReplicaPool([A, B, C]);
  // Nothing in flight anywhere: ties go to the fewest requests so far, then to the list's order.
  assert.deepEqual([pool.take(0), pool.take(0), pool.take(0)], [A, B, C]);
  pool.answered(A, 10);
  pool.answered(C, 10);
  // B still has one in flight: A and C are less loaded, A first (same count, earlier in the list).
  assert.equal(pool.take(0), A);
  assert.equal(pool.take(0), C);
  pool.answered(B, 30);
  assert.equal(pool.take(0), B);
  const stats = pool.stats(0);
  assert.deepEqual(
    stats.map((s) => [s.url, s.requests, s.mean_latency_ms]),
    [
      [A, 2, 10],
      [B, 2, 30],
      [C, 2, 10],
    ],
  );
});

test('a failed replica is drained, asked again after its backoff (doubling, capped), healthy after one answer', () => {
  const pool = new ReplicaPool([A, B]);
  assert.equal(pool.take(0), A);
  pool.failed(A, 0);
  assert.equal(pool.stats(0)[0].healthy, false);
  // While A is drained everything goes to B, however busy B is.
  for (let i = 0; i < 3; i++) assert.equal(pool.take(DRAIN_FIRST_MS - 1), B);
  // Past its retry time A is asked again (the least loaded now); failing again doubles the wait.
  assert.equal(pool.take(DRAIN_FIRST_MS), A);
  pool.failed(A, DRAIN_FIRST_MS);
  assert.equal(pool.take(DRAIN_FIRST_MS + 2 * DRAIN_FIRST_MS - 1), B);
  assert.equal(pool.take(DRAIN_FIRST_MS + 2 * DRAIN_FIRST_MS), A);
  // Requests in flight when it went away fail while it is drained: counted, but one outage is one backoff step.
  pool.failed(A, 3 * DRAIN_FIRST_MS);
  pool.failed(A, 3 * DRAIN_FIRST_MS + 1);
  assert.equal(pool.stats(3 * DRAIN_FIRST_MS + 4 * DRAIN_FIRST_MS - 1)[0].healthy, false);
  assert.equal(pool.stats(3 * DRAIN_FIRST_MS + 4 * DRAIN_FIRST_MS)[0].healthy, true, 'the drain was not extended');
  let t = 10_000_000;
  for (let i = 0; i < 10; i++) {
    pool.failed(A, t);
    t += DRAIN_MAX_MS;
  }
  t -= DRAIN_MAX_MS;
  assert.equal(pool.stats(t + DRAIN_MAX_MS - 1)[0].healthy, false, 'capped at DRAIN_MAX_MS');
  assert.equal(pool.stats(t + DRAIN_MAX_MS)[0].healthy, true);
  pool.answered(A, 5);
  assert.equal(pool.stats(0)[0].healthy, true, 'one answer ends the drain');
  assert.equal(pool.stats(0)[0].failures, 14);
});

test('past its retry time a drained replica takes one request (the probe) until that one is answered', () => {
  const pool = new ReplicaPool([A, B]);
  pool.take(0);
  pool.failed(A, 0);
  for (let i = 0; i < 3; i++) assert.equal(pool.take(1), B);
  // A is due and less loaded than B (3 in flight): it gets the probe, and nothing more while the probe runs.
  assert.equal(pool.take(DRAIN_FIRST_MS), A);
  assert.equal(pool.take(DRAIN_FIRST_MS), B);
  pool.answered(A, 10);
  assert.equal(pool.take(DRAIN_FIRST_MS), A, 'answered: healthy, and the least loaded again');
  assert.equal(pool.take(DRAIN_FIRST_MS), A);
});

test('a call tries each replica once; with every replica drained the one due first is still asked', () => {
  const pool = new ReplicaPool([A, B, C]);
  for (const url of [A, B, C]) {
    pool.take(0);
    pool.failed(url, url === B ? 0 : 100);
  }
  assert.equal(pool.take(50), B, 'all drained: the one due first');
  pool.released(B);
  // Healthy again later; this call failed on A already: C (fewer requests than B), then B.
  const tried = new Set([A]);
  assert.equal(pool.take(10_000, tried), C);
  tried.add(C);
  assert.equal(pool.take(10_000, tried), B);
  tried.add(B);
  assert.equal(pool.take(10_000, tried), undefined);
  // A request's own failure (released) leaves the replica healthy.
  assert.equal(
    pool.stats(10_000).every((s) => s.healthy),
    true,
  );
});

test('a replica listed twice (any spelling) is refused; an unknown one is named', () => {
  assert.throws(() => new ReplicaPool([A, 'http://a:8000/']), /http:\/\/a:8000 is listed twice/);
  assert.throws(() => new ReplicaPool([]), /at least one server/);
  assert.throws(() => new ReplicaPool([A]).answered(B, 1), /http:\/\/b:8000\/v1 is not one of its replicas/);
});

test('policy.baseUrls: the single baseUrl config stays valid; a pool names baseUrl among its replicas', () => {
  const single = parseConfig({ policy: { baseUrl: A } }).policy;
  assert.equal(single.baseUrls, undefined);
  assert.deepEqual(policyReplicas(single), [A]);
  // The default baseUrl is the first replica the launcher starts (127.0.0.1:8000).
  const launched = parseConfig({ policy: { baseUrls: ['http://127.0.0.1:8000/v1', 'http://127.0.0.1:8001/v1'] } }).policy;
  assert.deepEqual(policyReplicas(launched), ['http://127.0.0.1:8000/v1', 'http://127.0.0.1:8001/v1']);
  const bad =
    (policy: object, extra: object = {}) =>
    () =>
      parseConfig({ policy, ...extra });
  assert.throws(
    bad({ baseUrl: C, baseUrls: [A, B] }),
    (e: Error) => e instanceof ConfigError && /policy\.baseUrl/.test(e.message) && /is not one of policy\.baseUrls/.test(e.message),
  );
  assert.throws(bad({ baseUrl: A, baseUrls: [A, 'http://a:8000'] }), /listed twice/);
  assert.throws(bad({ baseUrl: A, baseUrls: [] }), /policy\.baseUrls/);
  assert.throws(bad({ baseUrl: A, baseUrls: ['not a url'] }), /policy\.baseUrls/);
  assert.throws(bad({ backend: 'colocated', baseUrl: A, baseUrls: [A, B] }), /backend openai/);
  assert.throws(
    bad({ baseUrl: A, baseUrls: [A, B] }, { train: { vllmBaseUrl: 'http://elsewhere:8000' } }),
    /train\.vllmBaseUrl http:\/\/elsewhere:8000 is not one of policy\.baseUrls/,
  );
  assert.doesNotThrow(bad({ baseUrl: A, baseUrls: [A, B] }, { train: { vllmBaseUrl: 'http://b:8000' } }));
});

test('--policy-url with several URLs (comma separated) is the pool: baseUrl the first, adapters loaded into every replica', () => {
  const o = applyRunOverrides('train', {}, { policyUrl: 'http://127.0.0.1:8000,http://127.0.0.1:8001/v1' });
  const cfg = parseConfig(o.raw);
  assert.equal(cfg.policy.baseUrl, 'http://127.0.0.1:8000/v1');
  assert.deepEqual(cfg.policy.baseUrls, ['http://127.0.0.1:8000/v1', 'http://127.0.0.1:8001/v1']);
  assert.equal(cfg.train.vllmBaseUrl, 'http://127.0.0.1:8000/v1');
  // One URL keeps the single-server config, and replaces a pool the file names.
  const single = parseConfig(applyRunOverrides('mcts', { policy: { baseUrl: A, baseUrls: [A, B] } }, { policyUrl: C }).raw);
  assert.deepEqual([single.policy.baseUrl, single.policy.baseUrls], [C, [C]]);
  assert.equal(parseConfig(applyRunOverrides('train', {}, { policyUrl: C }).raw).policy.baseUrls, undefined);
  assert.throws(() => applyRunOverrides('train', {}, { policyUrl: `${A},` }), /--policy-url .*an empty URL in the list/);
});
