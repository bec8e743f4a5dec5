import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import type { Browser, BrowserContext } from 'playwright-core';
import { BlobStore } from '../../blob/store';
import { DEFAULT_VIEWPORT, launchChromium } from '../../env/browser';
import { DEFAULT_EPISODE_MAX_TIME_MS, MINIWOB_SHOWN_ORIGIN, MiniWobEnv, toPlaywrightKeys } from '../../env/miniwob';
import { pngSize } from '../../host/png';
import { findMiniwobHtml, startMiniwobServer, type MiniwobServer } from '../../env/miniwob-server';
import { assertMiniwobTask, listMiniwobTasks } from '../../env/miniwob-tasks';
import { clickableElements } from '../../testing/axtree';

let browser: Browser;
let context: BrowserContext;
let server: MiniwobServer;
let blobRoot: string;
let blobs: BlobStore;
let env: MiniWobEnv;
let tasks: string[];

before(async () => {
  tasks = listMiniwobTasks(findMiniwobHtml());
  server = await startMiniwobServer();
  browser = await launchChromium();
  context = await browser.newContext({ viewport: DEFAULT_VIEWPORT });
  blobRoot = await mkdtemp(join(tmpdir(), 'halo-miniwob-blobs-'));
  blobs = new BlobStore(blobRoot);
  env = new MiniWobEnv({ page: await context.newPage(), baseUrl: server.baseUrl, blobs });
});

after(async () => {
  await env?.close().catch(() => undefined);
  await browser?.close().catch(() => undefined);
  await server?.close();
  if (blobRoot) await rm(blobRoot, { recursive: true, force: true });
});

/** The quoted part of a goal like `Click on the "Okay" button.` */
function quoted(goal: string): string {
  const m = /"([^"]+)"/.exec(goal);
  assert.ok(m, `no quoted text in goal ${JSON.stringify(goal)}`);
  return m[1];
}

async function assertPng1280x720(ref: string): Promise<void> {
  const png = await blobs.get(ref);
  assert.equal(png.subarray(0, 8).toString('hex'), '89504e470d0a1a0a', 'PNG signature');
  assert.equal(png.toString('latin1', 12, 16), 'IHDR');
  assert.deepEqual(pngSize(png), { width: 1280, height: 720 });
}

test('all 125 registered tasks reset, screenshot and step', async () => {
  assert.equal(tasks.length, 125);
  assert.ok(tasks.includes('click-button') && !tasks.some((t) => t.startsWith('flight.')));
  assert.deepEqual([...tasks].sort(), tasks);
  const t0 = Date.now();
  for (const [i, task] of tasks.entries()) {
    const obs = await env.reset({ env: 'miniwob', task, seed: i });
    assert.ok(obs.goal.trim().length > 0, `${task}: empty goal`);
    assert.equal(obs.step, 0);
    assert.equal(obs.width, 1280);
    assert.equal(obs.height, 720);
    assert.ok(obs.url.endsWith(`/miniwob/${task}.html`), obs.url);
    assert.ok(obs.axtree.length > 0 && obs.axtree.length <= 8_300, `${task}: axtree size ${obs.axtree.length}`);
    assert.ok(obs.axtree.split('\n').length <= 201, `${task}: too many axtree lines`);
    await assertPng1280x720(obs.screenshotRef);
    const out = await env.step({ type: 'wait', seconds: 0 });
    assert.ok(Number.isFinite(out.reward), `${task}: reward ${out.reward}`);
    assert.equal(typeof out.done, 'boolean');
    assert.equal(typeof out.success, 'boolean');
    assert.equal(out.actionError, undefined);
    assert.equal(out.observation.step, 1);
  }
  // Reported, not asserted: speed belongs to bench/, where it is measured side by side.
  console.log(`reset + screenshot + step: ${((Date.now() - t0) / tasks.length).toFixed(0)} ms per task`);
});

test('click-button seed 3 is solved by click_element', async () => {
  const obs = await env.reset({ env: 'miniwob', task: 'click-button', seed: 3 });
  const target = quoted(obs.goal);
  const button = clickableElements(obs.axtree).find((l) => l.role === 'button' && l.name === target);
  assert.ok(button, `no button ${target} in\n${obs.axtree}`);
  const out = await env.step({ type: 'click_element', id: button.id });
  assert.equal(out.actionError, undefined);
  assert.equal(out.done, true);
  assert.equal(out.success, true);
  assert.equal(out.reward, 1);
  assert.equal(out.observation.step, 1);
});

// A step group forks N pages at once, each loading its page and stepping as soon as it is ready: on 2 cores the
// renderers are slow while the others load. A click on a visible, enabled button must still land and count, not
// time out as a rejected action (most of them did with a 2 s limit).
test('click_element on 24 click-test pages forked at once: every click lands and succeeds', { timeout: 300_000 }, async () => {
  const contexts: BrowserContext[] = [];
  try {
    const outs = await Promise.all(
      Array.from({ length: 24 }, async (_, seed) => {
        const ctx = await browser.newContext({ viewport: DEFAULT_VIEWPORT });
        contexts.push(ctx);
        const e = new MiniWobEnv({ page: await ctx.newPage(), baseUrl: server.baseUrl, blobs });
        const obs = await e.reset({ env: 'miniwob', task: 'click-test', seed });
        const button = clickableElements(obs.axtree).find((l) => l.role === 'button');
        assert.ok(button, `no button in\n${obs.axtree}`);
        return e.step({ type: 'click_element', id: button.id });
      }),
    );
    assert.deepEqual(
      outs.map((o) => o.actionError ?? null),
      outs.map(() => null),
    );
    assert.deepEqual(
      outs.map((o) => o.success),
      outs.map(() => true),
    );
  } finally {
    await Promise.all(contexts.map((c) => c.close().catch(() => undefined)));
  }
});

test('click-button is solved by a grid click at the axtree centre (magnification + grid mapping)', async () => {
  for (const seed of [3, 11, 12]) {
    const obs = await env.reset({ env: 'miniwob', task: 'click-button', seed });
    const target = quoted(obs.goal);
    const button = clickableElements(obs.axtree).find((l) => l.role === 'button' && l.name === target);
    assert.ok(button, `no button ${target} in\n${obs.axtree}`);
    const out = await env.step({ type: 'click', x: button.x, y: button.y, button: 'left', count: 1 });
    assert.equal(out.actionError, undefined);
    assert.deepEqual([out.done, out.success, out.reward], [true, true, 1], `seed ${seed}: ${JSON.stringify(out)}`);
  }
});

test('a wrong button ends click-button with reward -1, and the result sticks', async () => {
  // Find a seed whose problem has a button with another label than the goal's.
  for (let seed = 0; seed < 20; seed++) {
    const obs = await env.reset({ env: 'miniwob', task: 'click-button', seed });
    const target = quoted(obs.goal);
    const lines = clickableElements(obs.axtree);
    const wrong = lines.find((l) => l.role === 'button' && l.name !== target);
    const right = lines.find((l) => l.role === 'button' && l.name === target);
    if (!wrong || !right) continue;
    const out = await env.step({ type: 'click', x: wrong.x, y: wrong.y, button: 'left', count: 1 });
    assert.equal(out.done, true);
    assert.equal(out.success, false);
    assert.equal(out.reward, -1);
    // MiniWoB shows its START cover again after an episode; later actions must not act or change the result.
    const again = await env.apply({ type: 'click_element', id: right.id });
    assert.deepEqual(again, { reward: -1, done: true, success: false, reason: out.reason });
    const atCover = await env.apply({ type: 'click', x: 100, y: 500, button: 'left', count: 1 });
    assert.equal(atCover.reward, -1);
    assert.equal(await env.page.evaluate('WOB_RAW_REWARD_GLOBAL'), -1);
    return;
  }
  assert.fail('no click-button seed with a wrong button in 20 seeds');
});

test('reset is deterministic per seed and seeds differ', async () => {
  const a = await env.reset({ env: 'miniwob', task: 'click-button', seed: 7 });
  const b = await env.reset({ env: 'miniwob', task: 'click-button', seed: 7 });
  assert.equal(a.goal, b.goal);
  assert.equal(a.axtree, b.axtree);
  assert.equal(a.screenshotRef, b.screenshotRef);
  const c1 = await env.reset({ env: 'miniwob', task: 'click-checkboxes', seed: 7 });
  await env.apply({ type: 'wait', seconds: 0 });
  const c2 = await env.reset({ env: 'miniwob', task: 'click-checkboxes', seed: 7 });
  assert.equal(c1.axtree, c2.axtree);
  const goals = new Set<string>();
  for (let seed = 1; seed <= 6; seed++) goals.add((await env.reset({ env: 'miniwob', task: 'click-button', seed })).goal);
  assert.ok(goals.size >= 2, `all seeds gave ${[...goals].join(' / ')}`);
});

test('element ids are stable across observations and replayable with apply only', async () => {
  const first = await env.reset({ env: 'miniwob', task: 'enter-text', seed: 4 });
  const textbox = clickableElements(first.axtree).find((l) => l.role === 'textbox');
  assert.ok(textbox);
  const stepped = await env.step({ type: 'type', id: textbox.id, text: 'ab' });
  const again = await env.observe();
  assert.equal(again.axtree, stepped.observation.axtree);
  assert.match(stepped.observation.axtree, new RegExp(`^\\[${textbox.id}\\] textbox value="ab" focused`, 'm'));
  // Replaying the same action prefix with apply() only gives the same tree.
  await env.reset({ env: 'miniwob', task: 'enter-text', seed: 4 });
  await env.apply({ type: 'type', id: textbox.id, text: 'ab' });
  assert.equal((await env.observe()).axtree, stepped.observation.axtree);
});

test('goto is refused, unknown ids and keys are action errors, enter-text is solved by type + click', async () => {
  const obs = await env.reset({ env: 'miniwob', task: 'enter-text', seed: 5 });
  const nav = await env.step({ type: 'goto', url: 'https://example.com/' });
  assert.equal(nav.actionError, 'navigation is not allowed in MiniWoB');
  assert.equal(nav.done, false);
  assert.equal(nav.observation.url, obs.url);
  // The page stays where it was; observations name it at the fixed origin, never by the server's random port.
  assert.equal(env.page.url(), `${env.baseUrl}/miniwob/enter-text.html`);
  assert.equal(obs.url, `${MINIWOB_SHOWN_ORIGIN}/miniwob/enter-text.html`);

  const missing = await env.apply({ type: 'click_element', id: 99_999 });
  assert.equal(missing.actionError, 'no element with id 99999');
  assert.equal(missing.done, false);
  const badKey = await env.apply({ type: 'key', keys: ['hyper'] });
  assert.match(badKey.actionError ?? '', /unknown key "hyper"/);

  const lines = clickableElements(obs.axtree);
  const textbox = lines.find((l) => l.role === 'textbox');
  const submit = lines.find((l) => l.role === 'button' && l.name === 'Submit');
  assert.ok(textbox && submit, obs.axtree);
  // A wrong text first, cleared with a key chord, then the right one.
  assert.equal((await env.apply({ type: 'type', id: textbox.id, text: 'wrong' })).actionError, undefined);
  assert.equal((await env.apply({ type: 'key', keys: ['ctrl', 'a'] })).actionError, undefined);
  assert.equal((await env.apply({ type: 'key', keys: ['backspace'] })).actionError, undefined);
  const typed = await env.step({ type: 'type', id: textbox.id, text: quoted(obs.goal) });
  assert.equal(typed.actionError, undefined);
  assert.equal(typed.done, false);
  const done = await env.step({ type: 'click_element', id: submit.id });
  assert.deepEqual([done.done, done.success, done.reward], [true, true, 1], JSON.stringify(done));
  assert.equal(done.observation.step, 8);
});

test('answer ends the episode with the page reward', async () => {
  await env.reset({ env: 'miniwob', task: 'click-test', seed: 1 });
  const out = await env.apply({ type: 'answer', text: 'done' });
  assert.deepEqual([out.done, out.success, out.reward], [true, false, 0]);
  assert.deepEqual(await env.apply({ type: 'wait', seconds: 0 }), out);
});

test('core.EPISODE_MAX_TIME is the configured value; a short limit times out with -1', async () => {
  await env.reset({ env: 'miniwob', task: 'click-test', seed: 1 });
  assert.equal(await env.page.evaluate('core.EPISODE_MAX_TIME'), DEFAULT_EPISODE_MAX_TIME_MS);
  const short = new MiniWobEnv({ page: await context.newPage(), baseUrl: server.baseUrl, blobs, episodeMaxTimeMs: 300 });
  try {
    await short.reset({ env: 'miniwob', task: 'book-flight', seed: 1 });
    assert.equal(await short.page.evaluate('core.EPISODE_MAX_TIME'), 300);
    const out = await short.apply({ type: 'wait', seconds: 0.5 });
    assert.deepEqual([out.done, out.success, out.reward, out.reason], [true, false, -1, 'timed out']);
  } finally {
    await short.close();
  }
});

test('key names map to Playwright chords', () => {
  assert.deepEqual(toPlaywrightKeys(['ctrl', 'a']), { keys: ['Control', 'KeyA'] });
  assert.deepEqual(toPlaywrightKeys(['Ctrl+Shift+Z']), { keys: ['Control', 'Shift', 'KeyZ'] });
  assert.deepEqual(toPlaywrightKeys(['cmd', 'v']), { keys: ['Meta', 'KeyV'] });
  assert.deepEqual(toPlaywrightKeys(['return']), { keys: ['Enter'] });
  assert.deepEqual(toPlaywrightKeys(['esc', 'up', 'pagedown', 'space', 'del', 'F5']), {
    keys: ['Escape', 'ArrowUp', 'PageDown', 'Space', 'Delete', 'F5'],
  });
  assert.deepEqual(toPlaywrightKeys(['shift', 'a']), { keys: ['Shift', 'a'] });
  assert.deepEqual(toPlaywrightKeys(['ctrl++']), { keys: ['Control', '+'] });
  assert.deepEqual(toPlaywrightKeys(['x']), { keys: ['x'] });
  assert.deepEqual(toPlaywrightKeys(['ctrl', 'hyper']), { unknown: 'hyper' });
});

test('unknown task names get a clear error with suggestions', () => {
  assert.throws(() => assertMiniwobTask('click-buton', tasks), /unknown MiniWoB task "click-buton".*"click-button"/);
  assert.throws(() => assertMiniwobTask('flight.AA', tasks), /unknown MiniWoB task/);
  assert.doesNotThrow(() => assertMiniwobTask('enter-text', tasks));
});

function rawGet(path: string): Promise<{ status: number; type: string | undefined }> {
  return new Promise((ok, fail) => {
    const req = request(`${server.baseUrl}/`, { path, method: 'GET' }, (res) => {
      res.resume();
      res.on('end', () => ok({ status: res.statusCode ?? 0, type: res.headers['content-type'] }));
    });
    req.on('error', fail);
    req.end();
  });
}

test('static server: content types, 403 on traversal, 404 on missing files', async () => {
  assert.deepEqual(await rawGet('/miniwob/click-button.html'), { status: 200, type: 'text/html; charset=utf-8' });
  assert.equal((await rawGet('/core/core.js')).type, 'text/javascript; charset=utf-8');
  assert.equal((await rawGet('/core/core.css')).type, 'text/css; charset=utf-8');
  assert.equal((await rawGet('/../../etc/passwd')).status, 403);
  assert.equal((await rawGet('/miniwob/../../../../etc/passwd')).status, 403);
  assert.equal((await rawGet('/%2e%2e/%2e%2e/etc/passwd')).status, 403);
  assert.equal((await rawGet('/miniwob/no-such-task.html')).status, 404);
  assert.equal((await rawGet('/miniwob/')).status, 404);
  await assert.rejects(env.reset({ env: 'miniwob', task: 'no-such-task', seed: 0 }), /HTTP 404/);
});
