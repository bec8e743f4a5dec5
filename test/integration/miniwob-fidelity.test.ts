// Our MiniWoB++ environment against the official Gymnasium environment (miniwob 1.1.0 driven by Selenium
// with Debian's chromedriver, installed by `./launch.sh setup` into .venv-miniwob-official): the same task
// and seed must give the same goal, fields and elements, a click the same raw reward, partial credit a
// failure on both sides, and `timeLimit: official` the package's own limit.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { after, before, test } from 'node:test';
import type { Browser, BrowserContext } from 'playwright-core';
import { BlobStore } from '../../blob/store';
import { DEFAULT_VIEWPORT, launchChromium, resolveChromiumPath } from '../../env/browser';
import { MiniWobEnv } from '../../env/miniwob';
import type { ApplyResult } from '../../env/types';
import { startMiniwobServer, type MiniwobServer } from '../../env/miniwob-server';

const ROOT = resolve(__dirname, '..', '..');
const OFFICIAL_PYTHON = join(ROOT, '.venv-miniwob-official', 'bin', 'python');
const OFFICIAL_SCRIPT = join(ROOT, 'test', 'helpers', 'miniwob-official.py');
const CHROMEDRIVER = process.env.HALO_CHROMEDRIVER ?? '/usr/bin/chromedriver';

// Tasks with plain and regex fields, fields given by the page (email-inbox-nl-turk), jQuery UI widgets and
// scrollable boxes (email-inbox, book-flight: 15 px narrower with scrollbars shown, as Selenium shows them).
const RESET_TASKS = [
  'click-test',
  'click-button',
  'click-link',
  'click-dialog',
  'click-checkboxes',
  'enter-text',
  'use-autocomplete',
  'social-media',
  'email-inbox',
  'email-inbox-nl-turk',
  'book-flight',
];
const RESET_SEEDS = [0, 3, 7];

const QUOTED = 'var m = /"([^"]*)"/.exec(core.getUtterance()); var t = m ? m[1] : null;';
const refsOf = (selector: string, filter = 'true') =>
  `return Array.from(document.querySelectorAll(${JSON.stringify(selector)})).filter(function (e) { return ${filter}; }).map(function (e) { return +e.dataset.wob_ref; });`;

/** Clicks chosen by page JavaScript after the reset (the same code on both sides), by MiniWoB element ref. */
const CLICKS = [
  { task: 'click-test', seed: 0, pick: refsOf('#subbtn') },
  { task: 'click-button', seed: 3, pick: QUOTED + refsOf('#area button', 'e.textContent === t') },
  { task: 'click-link', seed: 7, pick: QUOTED + refsOf('#area .alink', 'e.textContent === t') },
  { task: 'click-dialog', seed: 3, pick: refsOf('button.ui-dialog-titlebar-close') },
  // Partial credit: all but one of the boxes to tick, then Submit.
  {
    task: 'click-checkboxes',
    seed: 7,
    pick: [
      "var names = core.getUtterance().replace(/^Select /, '').replace(/ and click Submit\\.$/, '').split(', ');",
      "var boxes = Array.from(document.querySelectorAll('#boxes label')).filter(function (l) { return names.indexOf(l.textContent.trim()) >= 0; });",
      "var refs = boxes.map(function (l) { return +l.querySelector('input').dataset.wob_ref; });",
      "return refs.slice(0, refs.length - 1).concat([+document.querySelector('#subbtn').dataset.wob_ref]);",
    ].join('\n'),
  },
];

interface Element {
  ref: number;
  parent: number;
  tag: string;
  text: string;
  value: string;
  id: string;
  classes: string;
  box: number[];
}
interface OfficialOutput {
  resets: { task: string; seed: number; utterance: string; fields: string[][]; elements: Element[]; maxTimeMs: number }[];
  clicks: { task: string; seed: number; refs: number[]; done: boolean; raw: number; scaled: number; reason: unknown }[];
  ours: { task: string; seed: number; fields: string[][] | null; elements: Element[] }[];
  idle: { maxTimeMs: number; done: boolean; raw: number; reward: number; reason: unknown };
}

let browser: Browser;
let context: BrowserContext;
let server: MiniwobServer;
let blobRoot: string;
let blobs: BlobStore;
let env: MiniWobEnv;
const ourResets: { task: string; seed: number; goal: string; utterance: string; rawUtterance: unknown; dom: unknown }[] = [];
let official: Promise<OfficialOutput>;

function runOfficial(input: unknown): Promise<OfficialOutput> {
  return new Promise((ok, fail) => {
    const child = spawn(OFFICIAL_PYTHON, [OFFICIAL_SCRIPT], {
      env: { ...process.env, MINIWOB_CHROME_BINARY: resolveChromiumPath(), MINIWOB_CHROMEDRIVER: CHROMEDRIVER },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    child.on('error', fail);
    child.on('close', (code) => {
      if (code !== 0) fail(new Error(`official MiniWoB++ script exited ${code}:\n${err.slice(-4000)}`));
      else ok(JSON.parse(out) as OfficialOutput);
    });
    child.stdin.end(JSON.stringify(input));
  });
}

const sortedPairs = (pairs: string[][] | null) => (pairs ? [...pairs].sort((x, y) => x.join('\0').localeCompare(y.join('\0'))) : pairs);
const key = (c: { task: string; seed: number }) => `${c.task}#${c.seed}`;
/** The body spans the window, whose size is not the task's: every other box must match. */
const comparable = (elements: Element[]) => elements.map((e) => (e.tag === 'body' ? { ...e, box: e.box.slice(0, 2) } : e));

before(async () => {
  assert.ok(existsSync(OFFICIAL_PYTHON), `${OFFICIAL_PYTHON} is missing: run ./launch.sh setup`);
  assert.ok(existsSync(CHROMEDRIVER), `${CHROMEDRIVER} is missing: run ./launch.sh setup (Debian's chromium-driver)`);
  server = await startMiniwobServer();
  browser = await launchChromium();
  context = await browser.newContext({ viewport: DEFAULT_VIEWPORT });
  blobRoot = await mkdtemp(join(tmpdir(), 'halo-miniwob-fidelity-'));
  blobs = new BlobStore(blobRoot);
  env = new MiniWobEnv({ page: await context.newPage(), baseUrl: server.baseUrl, blobs });
  for (const task of RESET_TASKS) {
    for (const seed of RESET_SEEDS) {
      const obs = await env.reset({ env: 'miniwob', task, seed });
      const rawUtterance = await env.page.evaluate('core.getUtterance()');
      const utterance = typeof rawUtterance === 'string' ? rawUtterance : (rawUtterance as { utterance: string }).utterance;
      const dom = await env.page.evaluate('core.getDOMInfo()');
      ourResets.push({ task, seed, goal: obs.goal, utterance, rawUtterance, dom });
    }
  }
  // The official side runs while the idle test below waits out its own 10 s.
  official = runOfficial({
    idle: true,
    resets: RESET_TASKS.flatMap((task) => RESET_SEEDS.map((seed) => ({ task, seed }))),
    clicks: CLICKS,
    ours: ourResets.map(({ task, seed, utterance, rawUtterance, dom }) => ({ task, seed, utterance, rawUtterance, dom })),
  });
  official.catch(() => undefined);
});

after(async () => {
  await env?.close().catch(() => undefined);
  await browser?.close().catch(() => undefined);
  await server?.close();
  if (blobRoot) await rm(blobRoot, { recursive: true, force: true });
});

test('timeLimit official: an idle click-test episode ends at about 10 s with -1, as the official env does', async () => {
  const timed = new MiniWobEnv({ page: await context.newPage(), baseUrl: server.baseUrl, blobs, timeLimit: 'official' });
  try {
    await timed.reset({ env: 'miniwob', task: 'click-test', seed: 1 });
    const t0 = Date.now();
    assert.equal(await timed.page.evaluate('core.EPISODE_MAX_TIME'), 10_000);
    await new Promise((r) => setTimeout(r, 9_000 - (Date.now() - t0)));
    const early = await timed.apply({ type: 'wait', seconds: 0 });
    assert.equal(early.done, false, `ended before 9 s: ${JSON.stringify(early)}`);
    await new Promise((r) => setTimeout(r, 10_600 - (Date.now() - t0)));
    const late = await timed.apply({ type: 'wait', seconds: 0 });
    assert.deepEqual([late.done, late.success, late.reward, late.reason], [true, false, -1, 'timed out']);
  } finally {
    await timed.close();
  }
  const { idle } = await official;
  assert.deepEqual([idle.maxTimeMs, idle.done, idle.raw, idle.reward, idle.reason], [10_000, true, -1, -1, 'timed out']);
});

test('reset: goal, fields and elements equal the official reset for every sampled task and seed', async () => {
  const out = await official;
  const theirs = new Map(out.resets.map((r) => [key(r), r]));
  const ourFlat = new Map(out.ours.map((r) => [key(r), r]));
  assert.equal(theirs.size, RESET_TASKS.length * RESET_SEEDS.length);
  for (const ours of ourResets) {
    const k = key(ours);
    const off = theirs.get(k);
    const flat = ourFlat.get(k);
    assert.ok(off && flat, k);
    assert.equal(ours.utterance, off.utterance, `${k}: utterance`);
    assert.equal(ours.goal, off.utterance.replace(/\s+/g, ' ').trim(), `${k}: goal`);
    // Page-given fields (an object) come back in the serialiser's key order: compare them as a set.
    assert.deepEqual(sortedPairs(flat.fields), sortedPairs(off.fields), `${k}: fields`);
    assert.ok(off.elements.length > 3, `${k}: ${off.elements.length} elements`);
    assert.deepEqual(comparable(flat.elements), comparable(off.elements), `${k}: elements`);
    // Our default limit is raised; the official page keeps its own.
    assert.ok(off.maxTimeMs >= 7_000 && off.maxTimeMs <= 30_000, `${k}: official limit ${off.maxTimeMs}`);
  }
});

test('a correct click gives the official raw reward; partial credit is a failure on both sides', async () => {
  const out = await official;
  for (const c of CLICKS) {
    const k = key(c);
    const off = out.clicks.find((o) => key(o) === k);
    assert.ok(off, k);
    await env.reset({ env: 'miniwob', task: c.task, seed: c.seed });
    // getDOMInfo numbers the elements as the official reset did; the pick then names the same ones.
    await env.page.evaluate('core.getDOMInfo()');
    const refs = (await env.page.evaluate(`(function () {\n${c.pick}\n})()`)) as number[];
    assert.deepEqual(refs, off.refs, `${k}: refs`);
    assert.ok(refs.length > 0, `${k}: nothing to click`);
    let last: ApplyResult | undefined;
    for (const ref of refs) {
      const id = await env.page.evaluate(`document.querySelector('[data-wob_ref="${ref}"]').getAttribute('data-halo-id')`);
      assert.ok(id !== null, `${k}: ref ${ref} has no element id`);
      last = await env.apply({ type: 'click_element', id: Number(id) });
      assert.equal(last.actionError, undefined, `${k}: ${last.actionError}`);
    }
    assert.ok(last);
    assert.equal(off.done, true, `${k}: official episode not done`);
    assert.equal(last.done, true, `${k}: our episode not done`);
    assert.equal(last.reward, off.raw, `${k}: raw reward`);
    // The official binary reward: 1 only at raw 1.
    assert.equal(last.success, off.raw === 1, `${k}: success`);
    if (c.task === 'click-checkboxes') {
      assert.ok(off.raw > 0 && off.raw < 1, `${k}: expected partial credit, got ${off.raw}`);
      assert.equal(last.success, false);
    } else {
      assert.equal(off.raw, 1, `${k}: official raw ${off.raw}`);
      // Time-scaled, so below 1; how far below depends on the machine's load (0.84 on a loaded 2-core box).
      assert.ok(off.scaled > 0 && off.scaled < 1, `${k}: official scaled ${off.scaled}`);
    }
  }
});

test('reward official: a correct click reports the time-scaled reward and still succeeds', async () => {
  const scaled = new MiniWobEnv({ page: await context.newPage(), baseUrl: server.baseUrl, blobs, timeLimit: 'official', reward: 'official' });
  try {
    await scaled.reset({ env: 'miniwob', task: 'click-test', seed: 0 });
    const id = await scaled.page.evaluate(`document.querySelector('#subbtn').getAttribute('data-halo-id')`);
    const out = await scaled.apply({ type: 'click_element', id: Number(id) });
    assert.equal(out.done, true);
    assert.equal(out.success, true);
    assert.ok(out.reward > 0.9 && out.reward < 1, `reward ${out.reward}`);
    assert.equal(await scaled.page.evaluate('WOB_RAW_REWARD_GLOBAL'), 1);
  } finally {
    await scaled.close();
  }
});
