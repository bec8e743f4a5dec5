import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { RolloutStream, type StartedEpisode, type StreamSettings } from '../../lib/training/rollout-stream';

const settings = (o: Partial<StreamSettings> = {}): StreamSettings => ({ batchUnits: 2, unitSize: 1, slots: 8, maxStaleness: 1, episodeRetries: 1, updates: 10, ...o });

const units = (eps: StartedEpisode[]) => eps.map((e) => e.unit);

describe('RolloutStream', () => {
  test('k = 0 admits one batch per update: the synchronous iterations', () => {
    const s = new RolloutStream<string>(settings({ maxStaleness: 0 }));
    const first = s.startable(0, true);
    assert.deepEqual(units(first), [0, 1], 'one batch of units, though 8 slots are free');
    for (const e of first) s.finished(e, `r${e.unit}`);
    assert.deepEqual(s.startable(0, true), [], 'nothing more until the update on them ends');
    const b = s.takeBatch(0);
    assert.deepEqual(
      b?.units.map((u) => u.results),
      [['r0'], ['r1']],
    );
    assert.deepEqual(s.startable(0, true), [], 'still nothing while that update runs');
    s.updated();
    assert.deepEqual(
      s.startable(1, true).map((e) => [e.unit, e.version]),
      [
        [2, 1],
        [3, 1],
      ],
    );
  });

  test('slots lent to the evaluation stay free: the stream fills only the rest, and takes them back when returned', () => {
    const s = new RolloutStream<string>(settings({ slots: 4, maxStaleness: 2, batchUnits: 4 }));
    assert.deepEqual(units(s.startable(0, true, 3)), [0], 'one slot of four while the evaluation holds three');
    assert.deepEqual(units(s.startable(0, true, 4)), [], 'none while it holds all four');
    assert.deepEqual(units(s.startable(0, true, 0)), [1, 2, 3], 'the rest once they are given back');
    s.finished({ unit: 0, member: 0, attempt: 0 }, 'a');
    assert.deepEqual(units(s.startable(0, true, 1)), [], 'a freed slot goes to an evaluation episode waiting for it');
  });

  test('k = 1 keeps slots busy during an update, and new episodes sample from the newest version', () => {
    const s = new RolloutStream<string>(settings({ slots: 3, maxStaleness: 1, batchUnits: 2 }));
    assert.deepEqual(units(s.startable(0, true)), [0, 1, 2], 'slots filled, within (k + 1) × batchUnits = 4');
    s.finished({ unit: 0, member: 0, attempt: 0 }, 'a');
    s.finished({ unit: 1, member: 0, attempt: 0 }, 'b');
    // One slot free per finished episode; the fourth unit is the last the bound allows before an update.
    assert.deepEqual(units(s.startable(0, true)), [3]);
    assert.equal(s.inFlight, 2);
    assert.ok(s.takeBatch(0));
    s.updated();
    s.finished({ unit: 2, member: 0, attempt: 0 }, 'c');
    const next = s.startable(1, true);
    assert.deepEqual(
      next.map((e) => [e.unit, e.version]),
      [
        [4, 1],
        [5, 1],
      ],
      'two slots free; the bound now allows 6 units',
    );
    assert.ok(s.inFlight <= 3);
  });

  test('never more episodes in flight than slots, whatever the bound', () => {
    const s = new RolloutStream<number>(settings({ slots: 2, maxStaleness: 5, batchUnits: 4, unitSize: 3 }));
    const eps = s.startable(0, true);
    assert.equal(eps.length, 2);
    assert.equal(s.inFlight, 2);
    assert.equal(s.queued, 1, 'the third member of unit 0 waits for a slot');
    s.finished(eps[0], 1);
    assert.deepEqual(
      s.startable(0, true).map((e) => [e.unit, e.member]),
      [[0, 2]],
      "the queue before a new unit: a unit's members are not left behind",
    );
  });

  test('a unit older than k versions at use is dropped and counted; the batch forms from fresher ones', () => {
    const s = new RolloutStream<string>(settings({ slots: 4, maxStaleness: 1, batchUnits: 1 }));
    const [slow, a] = s.startable(0, true);
    assert.deepEqual([slow.unit, a.unit], [0, 1]);
    s.finished(a, 'a');
    assert.equal(s.takeBatch(0)?.units[0].unit, 1);
    s.updated();
    const later = s.startable(1, true);
    for (const e of later) s.finished(e, `x${e.unit}`);
    assert.ok(s.takeBatch(1));
    s.updated();
    for (const e of s.startable(2, true)) s.finished(e, `y${e.unit}`);
    s.finished(slow, 'slow');
    // Adapter v2 now: unit 0 sampled from v0 is 2 behind, more than k = 1.
    const b = s.takeBatch(2);
    assert.deepEqual(b?.droppedStale, [0]);
    assert.notEqual(b?.units[0].unit, 0);
    assert.equal(s.counters.droppedStale, 1);
    const stats = s.stats(b!);
    assert.equal(stats.groups_dropped_stale, 1);
    assert.equal(s.stats(b!).groups_dropped_stale, 0, 'counted once');
  });

  test('a failed episode runs again in a fresh session; past the budget its whole unit is dropped', () => {
    const s = new RolloutStream<string>(settings({ slots: 4, unitSize: 2, batchUnits: 1, episodeRetries: 1 }));
    const eps = s.startable(0, true);
    const [m0, m1] = eps.filter((e) => e.unit === 0);
    s.finished(m0, 'ok');
    assert.equal(s.failed(m1), 'retry');
    const again = s.startable(0, true);
    assert.deepEqual(
      again.map((e) => [e.unit, e.member, e.attempt]),
      [[0, 1, 1]],
      'the retry goes first',
    );
    assert.equal(s.failed(again[0]), 'dropped');
    assert.equal(s.counters.droppedFailed, 1);
    assert.equal(s.counters.retried, 1);
    // The unit's finished member is dropped with it: no partial group reaches a batch.
    const rest = eps.filter((e) => e.unit !== 0);
    for (const e of rest) s.finished(e, `u${e.unit}`);
    const b = s.takeBatch(0);
    assert.ok(b);
    assert.ok(b.units.every((u) => u.unit !== 0 && u.results.every((r) => r !== null)));
    assert.equal(s.failed({ unit: 0, member: 0, attempt: 0 }), 'ignored');
  });

  test('a dropped unit is replaced: the run still gets all its batches', () => {
    const s = new RolloutStream<number>(settings({ slots: 1, batchUnits: 1, maxStaleness: 0, episodeRetries: 0, updates: 2 }));
    let taken = 0;
    for (let v = 0; taken < 2; ) {
      const [e] = s.startable(v, true);
      assert.ok(e, 'a unit to run');
      if (e.unit === 0) s.failed(e);
      else s.finished(e, e.unit);
      const b = s.takeBatch(v);
      if (b) {
        taken++;
        s.updated();
        v++;
      }
    }
    assert.ok(s.allBatchesTaken);
    assert.deepEqual(s.startable(2, true), [], 'no unit beyond what the run needs');
    assert.equal(s.counters.admitted, 3);
  });

  test('a snapshot carries buffer, queue and counters through continue-as-new; not while episodes run', () => {
    const s = new RolloutStream<string>(settings({ slots: 1, unitSize: 2, batchUnits: 2 }));
    const [e] = s.startable(0, true);
    assert.throws(() => s.snapshot(), /in flight/);
    s.finished(e, 'done');
    const copy = new RolloutStream<string>(s.settings, JSON.parse(JSON.stringify(s.snapshot())));
    assert.equal(copy.queued, 1);
    const [next] = copy.startable(3, false);
    assert.deepEqual([next.unit, next.member, next.version], [0, 1, 3], 'queued members start even with admission closed');
    assert.deepEqual(copy.counters, s.counters);
  });

  test('refuses settings that cannot run', () => {
    assert.throws(() => new RolloutStream(settings({ slots: 0 })), RangeError);
  });
});
