import assert from 'node:assert/strict';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import type { Browser, BrowserContext } from 'playwright-core';
import { BlobStore } from '../../blob/store';
import { DEFAULT_VIEWPORT, launchChromium } from '../../env/browser';
import { pngSize } from '../../host/png';
import { RealEnv, type RealEnvOptions } from '../../env/real';
import { FinishStateError } from '../../env/real-finish';
import { checkSiteHealth, SiteUnreachableError } from '../../env/real-site';
import { evaluateFinalState, isSuccessOutput, UnscorableTaskError, type EvaluableTask } from '../../env/real-eval';
import { getRealTask, UnknownRealTaskError } from '../../env/real-tasks';
import { SiteLimiter } from '../../env/site-limits';
import { startFakeRealSite, type FakeRealSite } from '../../testing/fake-real-site';
import { parseAxtree } from '../../testing/axtree';

// The v2 task whose eval script the fake site's state can satisfy: it looks for an added, sent email to a
// given address whose text refers to meeting notes and asks for them (see the crafted states below).
const TASK = 'gomail-18';

let browser: Browser;
let site: FakeRealSite;
let blobRoot: string;
let blobs: BlobStore;
let scratch: string;
const contexts: BrowserContext[] = [];

before(async () => {
  site = await startFakeRealSite();
  browser = await launchChromium();
  blobRoot = await mkdtemp(join(tmpdir(), 'halo-real-blobs-'));
  blobs = new BlobStore(blobRoot);
  scratch = await mkdtemp(join(tmpdir(), 'halo-real-scratch-'));
});

after(async () => {
  for (const c of contexts) await c.close().catch(() => undefined);
  await browser?.close().catch(() => undefined);
  await site?.close();
  if (blobRoot) await rm(blobRoot, { recursive: true, force: true });
  if (scratch) await rm(scratch, { recursive: true, force: true });
});

/** A RealEnv in a fresh context, pointed at the fake site. */
async function newEnv(opts: Partial<RealEnvOptions> = {}): Promise<RealEnv> {
  const context = await browser.newContext({ viewport: DEFAULT_VIEWPORT });
  contexts.push(context);
  return new RealEnv({
    context,
    blobs,
    runId: 'test-run-1',
    originOverride: () => `${site.origin}/`,
    settleMs: 50,
    ...opts,
  });
}

function find(axtree: string, role: string, name: string): number {
  const hit = parseAxtree(axtree).find((l) => l.role === role && l.name === name);
  assert.ok(hit, `no ${role} "${name}" in\n${axtree}`);
  return hit.id;
}

/** Compose → To, Subject, Body → Send, through click_element and type; returns the last axtree. */
async function composeAndSend(env: RealEnv, to: string, subject: string, body: string): Promise<string> {
  let obs = await env.observe();
  let out = await env.step({ type: 'click_element', id: find(obs.axtree, 'button', 'Compose') });
  assert.equal(out.actionError, undefined);
  obs = out.observation;
  for (const [label, text] of [
    ['To', to],
    ['Subject', subject],
    ['Body', body],
  ] as const) {
    out = await env.step({ type: 'type', id: find(obs.axtree, 'textbox', label), text });
    assert.equal(out.actionError, undefined, label);
    assert.equal(out.done, false);
    obs = out.observation;
  }
  out = await env.step({ type: 'click_element', id: find(obs.axtree, 'button', 'Send') });
  assert.equal(out.actionError, undefined);
  return out.observation.axtree;
}

test('a full episode: reset, compose, send, answer; the real eval script says SUCCESS', async () => {
  const env = await newEnv();
  const task = getRealTask(TASK);
  const before = site.requests.length;
  const t0 = Date.now();
  const obs = await env.reset({ env: 'real', task: TASK, seed: 0 });

  // The harness protocol: /config (built from the origin: no "//config"), then /finish, then the site root.
  const reqs = site.requests.slice(before).filter((r) => r.method === 'GET');
  const paths = reqs.map((r) => r.path);
  assert.deepEqual(paths.slice(0, 3), ['/config', '/finish', '/'], paths.join(' '));
  assert.ok(!reqs.some((r) => r.url.startsWith('//')), 'no double slash');
  assert.deepEqual(reqs[0].query, { run_id: 'test-run-1', task_id: `v2.${TASK}`, latency: '0' });

  assert.equal(obs.goal, task.goal);
  assert.equal(obs.url, `${site.origin}/`);
  assert.equal(obs.step, 0);
  assert.deepEqual([obs.width, obs.height], [1280, 720]);
  assert.deepEqual(pngSize(await blobs.get(obs.screenshotRef)), { width: 1280, height: 720 });
  assert.match(obs.axtree, /^\[\d+\] button "Compose" @\(\d+,\d+\)$/m);
  assert.match(obs.axtree, /^\[\d+\] link "Help center" @\(\d+,\d+\)$/m);

  const tree = await composeAndSend(env, 'brian.king@example.com', 'Meeting notes', 'Hi Brian, could you please send me the notes from our meeting? Thanks!');
  assert.match(tree, /status "Message sent"/);

  // The client state the reward calculator reads.
  const state = (await env.clientState()) as { differences: { emails: { added: Array<{ to: string[]; sent: boolean }> } } };
  assert.equal(state.differences.emails.added.length, 1);
  assert.deepEqual(state.differences.emails.added[0].to, ['brian.king@example.com']);

  const finishesBefore = site.hits('/finish').length;
  const end = await env.step({ type: 'answer', text: 'I asked Brian for the meeting notes.' });
  assert.equal(site.hits('/finish').length, finishesBefore + 1, '/finish is reloaded for the final state');
  assert.deepEqual([end.done, end.success, end.reward, end.reason], [true, true, 1, 'SUCCESS']);
  assert.equal(end.evaluation?.output, 'SUCCESS');
  assert.equal(end.observation.step, 6);
  assert.ok(end.finalStateRef);
  const stored = await blobs.getJson<{ initialfinaldiff: { added: { email: { emails: Record<string, { subject: string }> } } } }>(end.finalStateRef);
  assert.deepEqual(
    Object.values(stored.initialfinaldiff.added.email.emails).map((e) => e.subject),
    ['Meeting notes'],
  );
  // The end sticks.
  const again = await env.apply({ type: 'click', x: 10, y: 10, button: 'left', count: 1 });
  assert.deepEqual([again.done, again.reward, again.finalStateRef], [true, 1, end.finalStateRef]);
  console.log(`# full REAL episode (reset + 6 steps + eval): ${Date.now() - t0} ms`);
  await env.close();
});

test('a wrong email ends with FAILURE and reward 0', async () => {
  const env = await newEnv();
  await env.reset({ env: 'real', task: TASK, seed: 0 });
  await composeAndSend(env, 'brian.king@example.com', 'Hello', 'Just saying hello.');
  const end = await env.apply({ type: 'answer', text: 'done' });
  assert.deepEqual([end.done, end.success, end.reward, end.reason], [true, false, 0, 'FAILURE']);

  // A second reset in the same context starts from clean storage for the origin.
  await env.page.evaluate(`localStorage.setItem('left-over', '1')`);
  const again = await env.reset({ env: 'real', task: TASK, seed: 0 });
  assert.equal(again.step, 0);
  assert.equal(await env.page.evaluate(`localStorage.getItem('left-over')`), null);
  const state = (await env.clientState()) as { differences: { emails: { added: unknown[] } } };
  assert.deepEqual(state.differences.emails.added, []);
  const fresh = await env.apply({ type: 'wait', seconds: 0 });
  assert.equal(fresh.done, false);
  await env.close();
});

/** A /finish-shaped state holding one added email (our own data, shaped like the gomail client state). */
function craftedState(email: Record<string, unknown>): object {
  const full = {
    id: 9,
    from: 'me@gomail.test',
    to: ['brian.king@example.com'],
    cc: [],
    bcc: [],
    subject: 'Notes',
    content: 'Please send me the meeting notes when you can.',
    sent: true,
    draft: false,
    spam: false,
    trash: false,
    ...email,
  };
  return {
    actionhistory: [],
    initialfinaldiff: { added: { email: { emails: { '4': full } } }, updated: {}, deleted: {} },
    differences: { emails: { added: [full], updated: [], deleted: [] } },
  };
}

test('the real agisdk eval script judges crafted states', async () => {
  const task = getRealTask(TASK);
  const ok = await evaluateFinalState(task, craftedState({}));
  assert.deepEqual([ok.success, ok.output, ok.error], [true, 'SUCCESS', undefined]);
  assert.ok(ok.durationMs > 0 && ok.durationMs < 30_000);
  // The same state as text is written byte for byte.
  assert.equal((await evaluateFinalState(task, JSON.stringify(craftedState({})))).success, true);
  for (const [why, change] of [
    ['wrong recipient', { to: ['someone.else@example.com'] }],
    ['not sent', { sent: false }],
    ['a draft', { draft: true }],
    ['no request', { subject: 'Meeting notes', content: 'Here are my thoughts on the notes of the meeting.' }],
  ] as const) {
    const res = await evaluateFinalState(task, craftedState(change));
    assert.deepEqual([res.success, res.output], [false, 'FAILURE'], why);
  }
  const empty = await evaluateFinalState(task, {});
  assert.deepEqual([empty.success, empty.output], [false, 'FAILURE']);
  await assert.rejects(evaluateFinalState(task, '{not json'), /final state of gomail-18 is not JSON/);
  // The harness's rule, case-insensitive substring of the trimmed stdout.
  assert.equal(isSuccessOutput('  success\n'), true);
  assert.equal(isSuccessOutput('FAILURE'), false);
});

test('an unscorable task is refused with a clear message', async () => {
  const task = getRealTask('gocalendar-11');
  assert.equal(task.scorable, false);
  await assert.rejects(evaluateFinalState(task, {}), (err: unknown) => {
    assert.ok(err instanceof UnscorableTaskError);
    assert.equal(err.taskId, 'gocalendar-11');
    assert.match(err.message, /REAL task gocalendar-11 cannot be scored: eval script eval_gocalendar_11\.py is empty/);
    return true;
  });
  const env = await newEnv();
  const before = site.requests.length;
  await assert.rejects(env.reset({ env: 'real', task: 'gocalendar-11', seed: 0 }), UnscorableTaskError);
  await assert.rejects(env.reset({ env: 'real', task: 'gomail-99', seed: 0 }), UnknownRealTaskError);
  await assert.rejects(env.reset({ env: 'miniwob', task: 'click-button', seed: 0 }), /RealEnv cannot run env "miniwob"/);
  assert.equal(site.requests.length, before, 'nothing was opened');
  await env.close();
});

test('eval scripts: timeout kills, exit codes follow the harness rule', async () => {
  const script = async (name: string, body: string): Promise<EvaluableTask> => {
    const path = join(scratch, name);
    await writeFile(path, body);
    await chmod(path, 0o644);
    return { id: name, evalScript: name, evalScriptPath: path, evalSha256: null, scorable: true };
  };
  const slow = await script('slow.py', 'import time\ntime.sleep(60)\nprint("SUCCESS")\n');
  const t0 = Date.now();
  const res = await evaluateFinalState(slow, {}, { timeoutMs: 700 });
  assert.equal(res.success, false);
  assert.match(res.error ?? '', /slow\.py timed out after 700 ms \(killed\)/);
  assert.ok(Date.now() - t0 < 5_000, `took ${Date.now() - t0} ms`);

  const crash = await script('crash.py', 'import sys\nraise SystemExit("boom")\n');
  const c = await evaluateFinalState(crash, {});
  assert.equal(c.success, false);
  assert.match(c.error ?? '', /crash\.py exited with code 1: boom/);

  // agisdk ignores the exit code: SUCCESS in stdout wins.
  const odd = await script('odd.py', 'import sys, json\njson.load(open(sys.argv[1]))\nprint("success")\nsys.exit(2)\n');
  const o = await evaluateFinalState(odd, { a: 1 });
  assert.deepEqual([o.success, o.exitCode, o.error], [true, 2, undefined]);

  // A script changed since the registry hashed it is refused.
  const changed = { ...(await script('changed.py', 'print("SUCCESS")\n')), evalSha256: '0'.repeat(64) };
  await assert.rejects(evaluateFinalState(changed, {}), /changed: sha256/);
  await assert.rejects(evaluateFinalState(odd, {}, { python: '/nonexistent/python' }), /cannot run the eval interpreter \/nonexistent\/python: not found/);
});

test('navigation off the task origin is blocked in the browser', async () => {
  const env = await newEnv();
  const obs = await env.reset({ env: 'real', task: TASK, seed: 0 });
  const home = `${site.origin}/`;
  const blocked = (url: string) => `navigation to ${url} blocked: outside ${site.origin}`;

  const viaGoto = await env.step({ type: 'goto', url: `${site.externalOrigin}/help` });
  assert.equal(viaGoto.actionError, blocked(`${site.externalOrigin}/help`));
  assert.equal(viaGoto.observation.url, home);
  assert.equal(viaGoto.done, false);

  const bare = await env.apply({ type: 'goto', url: 'www.example.com' });
  assert.equal(bare.actionError, blocked('https://www.example.com/'));

  const viaLink = await env.step({ type: 'click_element', id: find(obs.axtree, 'link', 'Help center') });
  assert.equal(viaLink.actionError, blocked(`${site.externalOrigin}/help`));
  assert.equal(viaLink.observation.url, home);
  assert.equal(env.page.url(), home);

  const viaForm = await env.step({ type: 'click_element', id: find(obs.axtree, 'button', 'Report a problem') });
  assert.equal(viaForm.actionError, blocked(`${site.externalOrigin}/post`));
  assert.equal(viaForm.observation.url, home);

  const viaPopup = await env.step({ type: 'click_element', id: find(obs.axtree, 'button', 'Open help in a new window') });
  assert.equal(viaPopup.actionError, blocked(`${site.externalOrigin}/help`));
  assert.equal(viaPopup.observation.url, home);

  const viaRedirect = await env.step({ type: 'click_element', id: find(obs.axtree, 'link', 'Service status') });
  assert.equal(viaRedirect.actionError, blocked(`${site.externalOrigin}/help`));
  assert.equal(viaRedirect.observation.url, home);

  const harness = await env.apply({ type: 'goto', url: '/finish' });
  assert.equal(harness.actionError, `navigation to ${site.origin}/finish blocked: /finish is reserved for the harness`);
  // However it is spelt: percent-encoded, upper case, doubled slashes, dot segments.
  for (const path of ['/%66inish', '/FINISH', '//finish/', '/x/%2e%2e/Config', '/%2566inish']) {
    const r = await env.apply({ type: 'goto', url: `${site.origin}${path}` });
    assert.match(r.actionError ?? '', /blocked: .* is reserved for the harness$/, `${path}: ${r.actionError}`);
  }

  assert.deepEqual(site.externalRequests, [], 'nothing reached the external origin');
  await new Promise((r) => setTimeout(r, 1_200));
  assert.deepEqual(
    env.context
      .pages()
      .map((p) => p.url())
      .sort(),
    [home, `${site.origin}/finish`].sort(),
    'popups are closed',
  );

  // Inside the origin navigation works: goto (relative), and a same-origin popup is followed in the agent page.
  const sent = await env.step({ type: 'goto', url: '/?folder=sent' });
  assert.equal(sent.actionError, undefined);
  assert.equal(sent.observation.url, `${site.origin}/?folder=sent`);
  assert.match(sent.observation.axtree, /heading "Sent"/);
  await env.step({ type: 'goto', url: home });
  const popupLocal = await env.step({ type: 'click_element', id: find((await env.observe()).axtree, 'button', 'Open sent mail in a new window') });
  assert.equal(popupLocal.actionError, undefined);
  assert.equal(popupLocal.observation.url, `${site.origin}/?folder=sent`);
  assert.deepEqual(site.externalRequests, []);
  await env.close();
});

test('health check: fine for the site, a quick clear SiteUnreachableError otherwise', async () => {
  const ok = await checkSiteHealth(`${site.origin}/`);
  assert.deepEqual([ok.origin, ok.status, ok.attempts], [site.origin, 200, 1]);

  // A port nobody listens on.
  const probe = createServer();
  await new Promise<void>((r) => probe.listen(0, '127.0.0.1', () => r()));
  const deadOrigin = `http://127.0.0.1:${(probe.address() as AddressInfo).port}`;
  await new Promise<void>((r) => probe.close(() => r()));
  const t0 = Date.now();
  await assert.rejects(checkSiteHealth(deadOrigin, { attempts: 3, backoffMs: 50, timeoutMs: 1_000 }), (err: unknown) => {
    assert.ok(err instanceof SiteUnreachableError);
    assert.equal(err.origin, deadOrigin);
    assert.match(err.message, new RegExp(`REAL site ${deadOrigin} is unreachable: ECONNREFUSED \\(3 attempts\\)`));
    return true;
  });
  assert.ok(Date.now() - t0 < 3_000, `took ${Date.now() - t0} ms`);

  // A gone deployment (404) is not retried.
  const gone = createServer((_req, res) => res.writeHead(404).end());
  await new Promise<void>((r) => gone.listen(0, '127.0.0.1', () => r()));
  const goneOrigin = `http://127.0.0.1:${(gone.address() as AddressInfo).port}`;
  await assert.rejects(checkSiteHealth(goneOrigin), /HTTP 404 Not Found at .* \(attempt 1 of 3, not retried\)/);
  await new Promise<void>((r) => gone.close(() => r()));

  // reset() against a dead origin fails with the same error type.
  const env = await newEnv({ originOverride: () => `${deadOrigin}/`, navigationTimeoutMs: 5_000 });
  await assert.rejects(env.reset({ env: 'real', task: TASK, seed: 0 }), (err: unknown) => err instanceof SiteUnreachableError && /ERR_CONNECTION_REFUSED/.test(err.message));
  await assert.rejects(env.health(deadOrigin, { attempts: 1 }), SiteUnreachableError);
  await env.close();
});

test('step cap: reward 0 without evaluation by default; evaluated when switched on', async () => {
  const env = await newEnv({ maxSteps: 2 });
  await env.reset({ env: 'real', task: TASK, seed: 0 });
  const finishes = site.hits('/finish').length;
  const first = await env.apply({ type: 'wait', seconds: 0 });
  assert.equal(first.done, false);
  const capped = await env.apply({ type: 'wait', seconds: 0 });
  assert.deepEqual([capped.done, capped.success, capped.reward, capped.truncated], [true, false, 0, true]);
  assert.match(capped.reason ?? '', /step cap reached after 2 steps: not evaluated/);
  assert.equal(capped.finalStateRef, undefined);
  assert.equal(capped.evaluation, undefined);
  assert.equal(site.hits('/finish').length, finishes, '/finish was not read');
  await env.close();

  // The caller's own cap: finishAtCap() without maxSteps.
  const manual = await newEnv();
  await manual.reset({ env: 'real', task: TASK, seed: 0 });
  await manual.apply({ type: 'wait', seconds: 0 });
  const m = await manual.finishAtCap();
  assert.deepEqual([m.done, m.reward, m.truncated], [true, 0, true]);
  assert.deepEqual((await manual.apply({ type: 'answer', text: 'late' })).reward, 0, 'an answer after the cap changes nothing');
  await manual.close();

  // evaluateAtCap: the 5th action (Send) hits the cap and the state is judged.
  const evaluating = await newEnv({ maxSteps: 5, evaluateAtCap: true });
  await evaluating.reset({ env: 'real', task: TASK, seed: 0 });
  await composeAndSend(evaluating, 'brian.king@example.com', 'Meeting notes', 'Could you send me the meeting notes please?');
  const judged = await evaluating.apply({ type: 'wait', seconds: 0 });
  assert.deepEqual([judged.done, judged.success, judged.reward, judged.reason, judged.truncated], [true, true, 1, 'SUCCESS', true]);
  assert.ok(judged.finalStateRef);
  await evaluating.close();
});

test('/finish polling waits for a slow <pre> and gives up clearly', async () => {
  const env = await newEnv({ finishPollMs: 100 });
  await env.reset({ env: 'real', task: TASK, seed: 0 });
  try {
    site.finishDelayMs = 1_500;
    const t0 = Date.now();
    const state = (await env.clientState()) as { differences: unknown };
    assert.ok(Date.now() - t0 >= 1_400);
    assert.deepEqual(state.differences, { emails: { added: [], updated: [], deleted: [] } });

    site.finishDelayMs = 5_000;
    const slow = await newEnv({ finishTimeoutMs: 800, finishPollMs: 100 });
    await slow.reset({ env: 'real', task: TASK, seed: 0 });
    await assert.rejects(slow.apply({ type: 'answer', text: 'done' }), (err: unknown) => {
      assert.ok(err instanceof FinishStateError);
      assert.match(err.message, /\/finish did not render a JSON <pre> within 800 ms \(<pre> is not JSON yet: "Loading state…"\)/);
      return true;
    });
    // The episode is not over: once the site answers, answering again is evaluated.
    site.finishDelayMs = 0;
    const end = await slow.apply({ type: 'answer', text: 'done' });
    assert.deepEqual([end.done, end.reward, end.reason], [true, 0, 'FAILURE']);
    await slow.close();
  } finally {
    site.finishDelayMs = 0;
  }
  await env.close();
});

test('a site limiter slot is held from reset to close', async () => {
  const limiter = new SiteLimiter(1);
  const a = await newEnv({ limiter, limiterTimeoutMs: 300 });
  const b = await newEnv({ limiter, limiterTimeoutMs: 300 });
  await a.reset({ env: 'real', task: TASK, seed: 0 });
  assert.deepEqual(limiter.stats(site.origin), { active: 1, waiting: 0, limit: 1 });
  await assert.rejects(b.reset({ env: 'real', task: TASK, seed: 0 }), /no free slot for http:\/\/127\.0\.0\.1:\d+ after \d+ ms/);
  await a.close();
  await b.reset({ env: 'real', task: TASK, seed: 0 });
  await b.close();
  assert.deepEqual(limiter.stats(site.origin), { active: 0, waiting: 0, limit: 1 });
});
