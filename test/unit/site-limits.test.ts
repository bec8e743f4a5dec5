import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ApplicationFailure } from '@temporalio/common';
import { sessionStartFailure } from '../../activities/session-errors';
import { DEFAULT_SITE_SLOT_TIMEOUT_MS, SiteLimiter, SiteSlotTimeoutError, siteSlotTimeoutFromEnv, slotHolder } from '../../env/site-limits';

const SITE = 'https://gomail.test';
const tick = () => new Promise((r) => setImmediate(r));
/** A wait that should end at once: a bounded one, so a regression fails here instead of hanging. */
const now = (limiter: SiteLimiter, holder: string) => limiter.acquire(SITE, { holder, timeoutMs: 200 });

test('the forks of a step group share their episode slot: admitted at once, even past waiting episodes', async () => {
  const limiter = new SiteLimiter(1);
  const main = await now(limiter, 'run-it1-ep0');
  let otherAdmitted = false;
  const other = limiter.acquire(SITE, { holder: 'run-it1-ep1' }).then((r) => {
    otherAdmitted = true;
    return r;
  });
  await tick();
  assert.deepEqual(limiter.stats(SITE), { active: 1, waiting: 1, limit: 1 });
  // N=8 forks of the same episode while its main session stays open, with another episode queued first.
  const forks = await Promise.all(Array.from({ length: 8 }, () => now(limiter, 'run-it1-ep0')));
  assert.deepEqual(limiter.stats(SITE), { active: 1, waiting: 1, limit: 1 });
  assert.deepEqual(limiter.holders(SITE), [{ holder: 'run-it1-ep0', sessions: 9 }]);

  // The slot is the episode's until its last session lets go.
  main();
  for (const f of forks.slice(0, 7)) f();
  await tick();
  assert.equal(otherAdmitted, false, 'one fork is still open');
  forks[7]();
  const r = await other;
  assert.deepEqual(limiter.holders(SITE), [{ holder: 'run-it1-ep1', sessions: 1 }]);
  r();
  assert.deepEqual(limiter.stats(SITE), { active: 0, waiting: 0, limit: 1 });
});

test('releasing one session twice does not drop another session of the episode', async () => {
  const limiter = new SiteLimiter(1);
  const a = await now(limiter, 'ep');
  const b = await now(limiter, 'ep');
  a();
  a();
  assert.deepEqual(limiter.holders(SITE), [{ holder: 'ep', sessions: 1 }]);
  await assert.rejects(limiter.acquire(SITE, { holder: 'other', timeoutMs: 20 }), SiteSlotTimeoutError);
  b();
  const c = await now(limiter, 'other');
  c();
});

test('sessions of a queued episode wait as one and are admitted together; episodes stay first come first served', async () => {
  const limiter = new SiteLimiter(1);
  const held = await now(limiter, 'a');
  const order: string[] = [];
  const noted =
    (label: string) =>
    <T>(r: T) => {
      order.push(label);
      return r;
    };
  const waits = [
    limiter.acquire(SITE, { holder: 'b' }).then(noted('b1')),
    limiter.acquire(SITE, { holder: 'c' }).then(noted('c')),
    limiter.acquire(SITE, { holder: 'b' }).then(noted('b2')),
  ];
  await tick();
  assert.deepEqual(limiter.stats(SITE), { active: 1, waiting: 2, limit: 1 }, 'episodes wait, not sessions');
  held();
  await tick();
  assert.deepEqual(order, ['b1', 'b2']);
  const b1 = await waits[0];
  const b2 = await waits[2];
  b1();
  await tick();
  assert.deepEqual(order, ['b1', 'b2']);
  b2();
  const c = await waits[1];
  assert.deepEqual(order, ['b1', 'b2', 'c']);
  c();
});

test('an MCTS search is one episode: its simulations share a slot; a test-time search shares its episode slot', async () => {
  assert.equal(slotHolder('run-it2-gomail-18#3'), 'run-it2-gomail-18');
  assert.equal(slotHolder('run-it2-gomail-18#12'), 'run-it2-gomail-18');
  assert.equal(slotHolder('run-it1-ep4'), 'run-it1-ep4');
  assert.equal(slotHolder('eval-ep0-search3#7'), 'eval-ep0');
  assert.equal(slotHolder('eval-ep0-search3'), 'eval-ep0');
  assert.notEqual(slotHolder('run-it1-ep1'), slotHolder('run-it1-ep10'));

  const limiter = new SiteLimiter(1);
  // Simulation 1's session still closing in the background while simulation 2 opens.
  const sim1 = await now(limiter, slotHolder('search-a#1'));
  const sim2 = await now(limiter, slotHolder('search-a#2'));
  assert.deepEqual(limiter.holders(SITE), [{ holder: 'search-a', sessions: 2 }]);
  await assert.rejects(limiter.acquire(SITE, { holder: slotHolder('eval-ep0'), timeoutMs: 20 }), SiteSlotTimeoutError, 'another episode is held off');
  sim1();
  sim2();
  // The episode keeps its session open while its test-time search runs.
  const episode = await now(limiter, slotHolder('eval-ep0'));
  const search = await now(limiter, slotHolder('eval-ep0-search1#0'));
  assert.deepEqual(limiter.holders(SITE), [{ holder: 'eval-ep0', sessions: 2 }]);
  search();
  episode();
});

test('a wait is bounded and says what holds the site and what to change', async () => {
  const limiter = new SiteLimiter(2);
  const a = await now(limiter, 'run-it1-ep0');
  const b = await now(limiter, 'run-it1-ep1');
  const queued = limiter.acquire(SITE, { holder: 'run-it1-ep2' });
  const started = Date.now();
  await assert.rejects(limiter.acquire(SITE, { holder: 'run-it1-ep3', timeoutMs: 50 }), (err: unknown) => {
    assert.ok(err instanceof SiteSlotTimeoutError);
    assert.equal(err.origin, SITE);
    assert.match(err.message, /^no free slot for https:\/\/gomail\.test after (\d+) ms: 2 episodes hold all 2 slots of this browser worker/);
    assert.ok(Number(/after (\d+) ms/.exec(err.message)![1]) >= 45, err.message);
    assert.match(err.message, /\(run-it1-ep0, run-it1-ep1\), 1 more waiting/);
    for (const knob of ['HALO_SITE_CONCURRENCY \\(2\\)', 'train\\.parallelism', 'HALO_SITE_SLOT_TIMEOUT_MS']) assert.match(err.message, new RegExp(knob));
    return true;
  });
  assert.ok(Date.now() - started < 1_000);
  assert.deepEqual(limiter.stats(SITE), { active: 2, waiting: 1, limit: 2 }, 'the episode that gave up left the queue');
  a();
  const c = await queued;
  b();
  c();
  assert.deepEqual(limiter.stats(SITE), { active: 0, waiting: 0, limit: 2 });
});

test('one session of a queued episode giving up leaves the others waiting; an aborted wait leaves the queue', async () => {
  const limiter = new SiteLimiter(1);
  const held = await now(limiter, 'a');
  const patient = limiter.acquire(SITE, { holder: 'b' });
  await assert.rejects(limiter.acquire(SITE, { holder: 'b', timeoutMs: 20 }), SiteSlotTimeoutError);
  assert.equal(limiter.stats(SITE).waiting, 1);
  const abort = new AbortController();
  const cancelled = limiter.acquire(SITE, { holder: 'c', signal: abort.signal });
  await tick();
  assert.equal(limiter.stats(SITE).waiting, 2);
  abort.abort(new Error('activity cancelled'));
  await assert.rejects(cancelled, /activity cancelled/);
  assert.equal(limiter.stats(SITE).waiting, 1);
  held();
  const b = await patient;
  assert.deepEqual(limiter.holders(SITE), [{ holder: 'b', sessions: 1 }]);
  b();
  assert.deepEqual(limiter.stats(SITE), { active: 0, waiting: 0, limit: 1 });
});

test('the slot timeout setting, and a timeout is a retryable start failure', () => {
  assert.equal(siteSlotTimeoutFromEnv({}), DEFAULT_SITE_SLOT_TIMEOUT_MS);
  assert.equal(DEFAULT_SITE_SLOT_TIMEOUT_MS, 600_000);
  assert.equal(siteSlotTimeoutFromEnv({ HALO_SITE_SLOT_TIMEOUT_MS: '90000' }), 90_000);
  for (const bad of ['0', '-5', '1.5', 'ten minutes']) {
    assert.throws(() => siteSlotTimeoutFromEnv({ HALO_SITE_SLOT_TIMEOUT_MS: bad }), /HALO_SITE_SLOT_TIMEOUT_MS must be a whole number of milliseconds/);
  }
  const failure = sessionStartFailure(new SiteSlotTimeoutError(SITE, 4, 600_000, ['e1', 'e2', 'e3', 'e4'], 0));
  assert.ok(failure instanceof ApplicationFailure);
  assert.equal(failure.nonRetryable, false);
  assert.equal(failure.type, 'SiteSlotTimeout');
  assert.match(failure.message, /no free slot for https:\/\/gomail\.test after 600000 ms: 4 episodes hold all 4 slots/);
});
