import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import {
  EXPECTED_AGISDK_VERSION,
  closeRealTaskIds,
  findAgisdk,
  getRealTask,
  listRealTasks,
  loadRealRegistry,
  realTasksBySite,
  registrySnapshot,
  UnknownRealTaskError,
} from '../../env/real-tasks';
import { SiteLimiter, SiteSlotTimeoutError } from '../../env/site-limits';

// Per-site counts of the v2 set in agisdk 0.3.5 (research notes, checked against the installed package).
const EXPECTED_COUNTS: Record<string, number> = {
  dashdish: 11,
  gocalendar: 10,
  gomail: 21,
  marrisuite: 1,
  networkin: 10,
  omnizon: 10,
  opendining: 11,
  staynb: 11,
  topwork: 12,
  udriver: 14,
  zilloft: 10,
};

test('the installed agisdk is found and is the pinned version', () => {
  const loc = findAgisdk();
  assert.match(loc.dir, /agisdk$/);
  assert.equal(loc.version, EXPECTED_AGISDK_VERSION);
  const reg = loadRealRegistry();
  assert.equal(reg.agisdkVersion, EXPECTED_AGISDK_VERSION);
  assert.equal(loadRealRegistry(), reg, 'the registry is cached per folder');
});

test('121 v2 tasks with ids, goals, sites, start URLs and eval scripts', () => {
  const tasks = listRealTasks();
  assert.equal(tasks.length, 121);
  const reg = loadRealRegistry();
  const files = readdirSync(reg.tasksDir).filter((f) => f.endsWith('.json'));
  assert.equal(files.length, 121);
  const ids = new Set(tasks.map((t) => t.id));
  assert.equal(ids.size, 121);
  for (const t of tasks) {
    assert.match(t.id, /^[a-z]+-\d+$/);
    assert.equal(t.canonicalId, `v2.${t.id}`);
    assert.equal(t.id.replace(/-\d+$/, ''), t.site, `${t.id}: site ${t.site}`);
    assert.ok(t.goal.trim().length > 0, `${t.id}: empty goal`);
    assert.match(t.startUrl, /^https:\/\/[^/]+\/?$/, `${t.id}: ${t.startUrl}`);
    assert.equal(t.origin, new URL(t.startUrl).origin);
    assert.ok(!t.origin.endsWith('/'));
    assert.equal(t.evalScript, `eval_${t.site}_${t.id.split('-').pop()}.py`);
    assert.equal(t.evalScriptPath, join(reg.evalScriptsDir, t.evalScript));
    // The task's own JSON agrees with what the registry says.
    const raw = JSON.parse(readFileSync(join(reg.tasksDir, `${t.id}.json`), 'utf8')) as {
      id: string;
      goal: string;
      website: { id: string; url: string };
      evals: Array<{ script: string }>;
    };
    assert.equal(raw.id, t.id);
    assert.equal(raw.goal, t.goal);
    assert.equal(raw.website.url, t.startUrl);
    assert.equal(raw.evals[0].script, t.evalScript);
  }
  // Sorted by site, then by number.
  const order = tasks.map((t) => `${t.site}/${t.id.split('-').pop()!.padStart(4, '0')}`);
  assert.deepEqual(order, [...order].sort());
});

test('per-site counts match agisdk 0.3.5', () => {
  const bySite = realTasksBySite();
  const counts = Object.fromEntries(Object.entries(bySite).map(([site, ts]) => [site, ts.length]));
  assert.deepEqual(counts, EXPECTED_COUNTS);
  assert.deepEqual(Object.keys(bySite), Object.keys(EXPECTED_COUNTS).sort());
  for (const [site, ts] of Object.entries(bySite)) assert.ok(ts.every((t) => t.site === site));
});

test('unscorable tasks: exactly gocalendar-11, whose eval script is empty', () => {
  const unscorable = listRealTasks().filter((t) => !t.scorable);
  assert.deepEqual(
    unscorable.map((t) => t.id),
    ['gocalendar-11'],
  );
  const t = getRealTask('gocalendar-11');
  assert.equal(readFileSync(t.evalScriptPath).length, 0);
  assert.match(t.unscorableReason ?? '', /eval_gocalendar_11\.py is empty \(0 bytes\)/);
  // The sha256 of an empty file is still recorded: the snapshot pins what was there.
  assert.equal(t.evalSha256, createHash('sha256').update(Buffer.alloc(0)).digest('hex'));
  assert.equal(getRealTask('gomail-18').scorable, true);
});

test('sha256 of every eval script matches its bytes', () => {
  for (const t of listRealTasks()) {
    const expected = createHash('sha256').update(readFileSync(t.evalScriptPath)).digest('hex');
    assert.equal(t.evalSha256, expected, t.id);
  }
});

test('registrySnapshot is JSON-able and complete', () => {
  const snap = registrySnapshot();
  const round = JSON.parse(JSON.stringify(snap)) as typeof snap;
  assert.deepEqual(round, snap);
  assert.equal(snap.agisdk_version, EXPECTED_AGISDK_VERSION);
  assert.equal(snap.tasks.length, 121);
  assert.deepEqual(Object.keys(snap.tasks[0]).sort(), ['eval_script', 'eval_sha256', 'goal', 'id', 'scorable', 'site', 'start_url']);
  const gomail18 = snap.tasks.find((t) => t.id === 'gomail-18');
  assert.ok(gomail18);
  assert.equal(gomail18.eval_script, 'eval_gomail_18.py');
  assert.equal(gomail18.scorable, true);
  assert.match(gomail18.eval_sha256 ?? '', /^[0-9a-f]{64}$/);
});

test('getRealTask accepts canonical ids and rejects unknown ones with suggestions', () => {
  assert.equal(getRealTask('v2.gomail-18').id, 'gomail-18');
  assert.equal(getRealTask(' gomail-18 ').id, 'gomail-18');
  assert.throws(
    () => getRealTask('gomail-99'),
    (err: unknown) => {
      assert.ok(err instanceof UnknownRealTaskError);
      assert.match(err.message, /unknown REAL task "gomail-99" \(121 v2 tasks/);
      assert.match(err.message, /did you mean .*"gomail-9"/);
      return true;
    },
  );
  assert.throws(() => getRealTask('gomial-1'), /unknown REAL task "gomial-1".*did you mean "gomail-1"/);
  assert.throws(
    () => getRealTask('flyunified-1'),
    (err: unknown) => err instanceof UnknownRealTaskError,
  );
  assert.throws(
    () => getRealTask('zzzzzzzzzzzzzzzz'),
    (err: unknown) => err instanceof UnknownRealTaskError && !/did you mean/.test(err.message),
  );
  assert.deepEqual(closeRealTaskIds('udriver-100', ['udriver-10', 'udriver-1', 'gomail-1']).slice(0, 1), ['udriver-10']);
});

test('HALO_AGISDK_DIR must point at an agisdk package folder', () => {
  const saved = process.env.HALO_AGISDK_DIR;
  const dir = loadRealRegistry().agisdkDir;
  try {
    process.env.HALO_AGISDK_DIR = '/nonexistent/agisdk';
    assert.throws(() => findAgisdk(), /HALO_AGISDK_DIR=\/nonexistent\/agisdk is not an agisdk package folder/);
    process.env.HALO_AGISDK_DIR = dir;
    assert.equal(findAgisdk().version, EXPECTED_AGISDK_VERSION);
  } finally {
    if (saved === undefined) delete process.env.HALO_AGISDK_DIR;
    else process.env.HALO_AGISDK_DIR = saved;
  }
});

test('site limiter: a per-origin cap with FIFO waiters, timeouts and per-site limits', async () => {
  const limiter = new SiteLimiter({ default: 2, 'https://b.test': 1 });
  const a1 = await limiter.acquire('https://a.test/');
  const a2 = await limiter.acquire('https://a.test/x');
  assert.deepEqual(limiter.stats('https://a.test'), { active: 2, waiting: 0, limit: 2 });
  const order: number[] = [];
  const w3 = limiter.acquire('https://a.test').then((r) => {
    order.push(3);
    return r;
  });
  const w4 = limiter.acquire('https://a.test').then((r) => {
    order.push(4);
    return r;
  });
  await new Promise((r) => setImmediate(r));
  assert.deepEqual(limiter.stats('https://a.test'), { active: 2, waiting: 2, limit: 2 });
  // Another origin is not held up.
  const b1 = await limiter.acquire('https://b.test');
  await assert.rejects(limiter.acquire('https://b.test', { timeoutMs: 30 }), (err: unknown) => err instanceof SiteSlotTimeoutError && /https:\/\/b\.test/.test(err.message));
  a1();
  a1(); // a second release is harmless
  const r3 = await w3;
  assert.deepEqual(order, [3]);
  a2();
  const r4 = await w4;
  assert.deepEqual(order, [3, 4]);
  r3();
  r4();
  b1();
  assert.deepEqual(limiter.stats('https://a.test'), { active: 0, waiting: 0, limit: 2 });
  assert.equal(await limiter.run('https://a.test', async () => 42), 42);
  assert.throws(() => new SiteLimiter(0), /integer >= 1/);
});

test('caveats: the scripts that read outside their state file and the task on a production alias', () => {
  const noted = Object.fromEntries(listRealTasks().flatMap((t) => (t.caveats.length ? [[t.id, t.caveats]] : [])));
  assert.deepEqual(Object.keys(noted).sort(), ['networkin-25', 'omnizon-28', 'opendining-17']);
  assert.match(noted['omnizon-28'][0], /reads the files next to its state file/);
  assert.match(noted['networkin-25'][0], /name of its state file's folder/);
  assert.match(
    noted['opendining-17'][0],
    /^runs on https:\/\/real-opendining\.vercel\.app, not https:\/\/real-opendining-fdcw98zrb-real-sites\.vercel\.app where the other 10 opendining tasks run/,
  );
  assert.deepEqual(registrySnapshot().tasks.find((t) => t.id === 'omnizon-28')?.caveats, noted['omnizon-28']);
});
