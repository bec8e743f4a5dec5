import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import type { Browser, CDPSession, Page } from 'playwright-core';
import { BlobStore } from '../../blob/store';
import { createControlActivities } from '../../activities/control';
import { launchChromium } from '../../env/browser';
import { captureViewport, executePageAction, readPageView, type PageAction, type PageGeometry } from '../../env/page-actions';
import { actionKey, clip, isValidAction, type AgentAction } from '../../lib/model-io/actions';
import { PREVIEW_CHARS } from '../../lib/training/completion';
import type { ObservationRef, StepResultBlob, TrajectoryInput, TrajectoryStepInput } from '../../lib/episode/episode-types';
import { parseAction } from '../../lib/model-io/parse';
import { pngInfo } from '../../host/png';
import { buildPrompt } from '../../lib/model-io/prompt';
import { computeReward, defaultRewardWeights, initialRewardState, stateKey, summarizeBreakdown } from '../../lib/rewards';
import { rewardForUnparsedOutput } from '../../lib/rewards/shaping';
import type { RewardState } from '../../lib/rewards/types';
import { formatMetricsLine, type MetricsLine } from '../../lib/training/run-metrics';
import { findElementCentre } from '../../client/viewer-html';
import { resolveEpisodeSource, writeEpisodeView, type Trajectory } from '../../client/commands/view';
import { singleEpisodeInput } from '../../client/episode-input';
import { parseConfig } from '../../lib/config/config';
import type { EpisodeResult } from '../../lib/episode/episode-types';
import { startFakePolicyServer, type FakePolicyServer } from '../../testing/fake-policy-server';
import { startTestStack, type TestStack } from '../../testing/stack';
import { NoMetricsError, resolveRunMetrics, writeRunReport } from '../../client/commands/report';
import { MCTS_REPORT_CHARTS, REPORT_CHARTS } from '../../client/report-charts';

// A small but real episode: a local page driven by the environment's own page script and action executor,
// screenshots and accessibility trees into a real blob store, shaped rewards from the real calculator, and
// the trajectory assembled by the real recordTrajectory activity. Then the viewer and the report are opened
// in headless Chromium and checked for what a person would look at.

const PAGE = `<!doctype html><html><head><title>tiny</title><style>
  body { margin:0; font:20px sans-serif; background:#fafafa; }
  h1 { position:absolute; left:20px; top:10px; margin:0; font-size:22px; }
  #name { position:absolute; left:40px; top:80px; width:240px; height:36px; font-size:18px; }
  #ok { position:absolute; left:400px; top:200px; width:120px; height:50px; font-size:20px; background:#2b6cb0; color:#fff; border:0; }
  #status { position:absolute; left:40px; top:290px; }
</style></head><body>
  <h1>Type your name and press OK</h1>
  <input id="name" aria-label="Name" placeholder="name">
  <button id="ok" onclick="document.getElementById('status').textContent = 'Hello ' + document.getElementById('name').value">OK</button>
  <div id="status">waiting</div>
</body></html>`;

const GEOM: PageGeometry = { zoom: 1, viewport: { width: 640, height: 360 } };
const AX = { zoom: 1, width: 640, height: 360, maxLines: 200, maxChars: 8000 };
const GOAL = 'Type your name and press OK.';

let server: Server;
let baseUrl: string;
let browser: Browser;
let work: string;

before(async () => {
  work = mkdtempSync(join(tmpdir(), 'halo-viewer-'));
  // Chromium opens the written pages as file:// URLs, and under a root worker it runs as HALO_BROWSER_USER (not
  // root, env/browser-user.ts): the folder must be readable by others, as a user's own output folder is.
  chmodSync(work, 0o755);
  server = createServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
    res.end(PAGE);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const addr = server.address();
  if (!addr || typeof addr === 'string') throw new Error('no port');
  baseUrl = `http://127.0.0.1:${addr.port}/tiny.html`;
  browser = await launchChromium();
});

after(async () => {
  await browser?.close();
  await new Promise<void>((r) => server.close(() => r()));
  rmSync(work, { recursive: true, force: true });
});

interface Obs {
  ref: Omit<ObservationRef, 'goal'>;
  axtree: string;
  url: string;
}

async function observe(page: Page, cdp: CDPSession, blobs: BlobStore, step: number): Promise<Obs> {
  const view = await readPageView(page, AX);
  const png = await captureViewport(cdp, GEOM, view.scrollX, view.scrollY);
  const url = page.url();
  return {
    ref: {
      url,
      step,
      width: GEOM.viewport.width,
      height: GEOM.viewport.height,
      screenshotRef: await blobs.put(png, 'png'),
      axtreeRef: await blobs.put(view.axtree, 'txt'),
      stateKey: stateKey({ url, axtree: view.axtree }),
    },
    axtree: view.axtree,
    url,
  };
}

function elementId(axtree: string, pattern: RegExp): number {
  const line = axtree.split('\n').find((l) => pattern.test(l));
  assert.ok(line, `no line matching ${pattern} in\n${axtree}`);
  return Number(/^\[(\d+)\]/.exec(line!)![1]);
}

const toolCall = (args: Record<string, unknown>) => `I will act now.\n<tool_call>\n${JSON.stringify({ name: 'computer_use', arguments: args })}\n</tool_call>`;

/** Runs the scripted episode and records it with the real recordTrajectory activity; returns the trajectory ref. */
async function recordEpisode(blobs: BlobStore): Promise<string> {
  const page = await browser.newPage({ viewport: GEOM.viewport });
  const cdp = await page.context().newCDPSession(page);
  await page.goto(baseUrl);
  const weights = defaultRewardWeights();
  const first = await observe(page, cdp, blobs, 0);
  const initial: ObservationRef = { ...first.ref, goal: GOAL };
  let state: RewardState = initialRewardState({ url: first.url, axtree: first.axtree });
  let current = first;
  const steps: TrajectoryStepInput[] = [];
  const history: { step: number; action: string }[] = [];

  const nameId = elementId(first.axtree, /textbox "Name"/);
  const okCentre = findElementCentre(first.axtree, elementId(first.axtree, /button "OK"/))!;
  const completions = [
    toolCall({ action: 'click_element', element_id: nameId }),
    toolCall({ action: 'type', text: 'Ada' }),
    toolCall({ action: 'left_click', coordinate: [okCentre.x + 10, okCentre.y - 5] }),
    'Sorry, I cannot decide what to do here.',
    toolCall({ action: 'answer', text: 'Pressed OK after typing Ada.' }),
  ];

  for (const [i, completion] of completions.entries()) {
    const stepNo = i + 1;
    const promptRef = await blobs.putJson(
      buildPrompt({ goal: GOAL, url: current.url, axtree: current.axtree, step: stepNo, screenshotRef: current.ref.screenshotRef }, history, 5),
    );
    const action: AgentAction = parseAction(completion);
    // The completion as the sampler records it: the text by reference (scripted, so no finish reason).
    const record = { ref: await blobs.put(completion, 'txt'), preview: clip(completion, PREVIEW_CHARS), finishReason: null, action, valid: isValidAction(action) };
    if (!isValidAction(action)) {
      const r = rewardForUnparsedOutput(current.ref.stateKey, state, weights);
      state = r.state;
      steps.push({ step: stepNo, promptRef, completion: record, shaped: r.breakdown });
      history.push({ step: stepNo, action: 'invalid' });
      continue;
    }
    if (action.type !== 'answer') {
      const err = await executePageAction(page, action as PageAction, GEOM);
      assert.equal(err, undefined, `action ${action.type} failed: ${err}`);
    }
    const done = action.type === 'answer';
    const next = await observe(page, cdp, blobs, stepNo);
    const success = done && (await page.textContent('#status')) === 'Hello Ada';
    const envReward = done ? (success ? 1 : 0) : 0;
    const r = computeReward(
      {
        site: null,
        valid: true,
        actionKey: actionKey(action),
        before: { url: current.url, axtree: current.axtree },
        after: { url: next.url, axtree: next.axtree },
        taskSuccess: done ? success : null,
        envReward,
      },
      state,
      weights,
    );
    state = r.state;
    const blob: StepResultBlob = {
      index: i,
      action,
      breakdown: r.breakdown,
      observation: next.ref,
      reward: envReward,
      done,
      success,
      reason: done ? 'answered' : null,
      shaped: { total: r.breakdown.total, summary: summarizeBreakdown(r.breakdown) },
      rewardState: state,
    };
    steps.push({ step: stepNo, promptRef, completion: record, resultRef: await blobs.putJson(blob) });
    history.push({ step: stepNo, action: action.type });
    current = next;
  }
  await page.close();
  const input: TrajectoryInput = {
    workflowId: 'episode-test-tiny-s0',
    task: { env: 'miniwob', task: 'tiny-form', seed: 0 },
    policyModel: 'scripted',
    initial,
    steps,
    success: true,
    reward: 1,
    reason: 'answered',
  };
  return createControlActivities(blobs).recordTrajectory(input);
}

test('the episode viewer shows every step with its screenshot, action overlay and reward terms', async () => {
  const blobs = new BlobStore(join(work, 'blobs'));
  const ref = await recordEpisode(blobs);
  const t = await blobs.getJson<Trajectory>(ref);
  assert.equal(t.version, 2);
  assert.equal(t.steps.length, 5);
  assert.deepEqual(
    t.steps.map((s) => s.completion.action.type),
    ['click_element', 'type', 'click', 'invalid', 'answer'],
  );

  const out = join(work, 'views', 'episode.html');
  const res = await writeEpisodeView({ trajectory: ref, blobs, out, writeJson: true });
  assert.equal(res.path, out);
  assert.equal(res.steps, 5);
  assert.ok(existsSync(res.jsonPath!));
  const html = readFileSync(out, 'utf8');
  assert.doesNotMatch(html, /src="(?!data:)/, 'every image is embedded');

  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  try {
    await page.goto(pathToFileURL(out).href);
    await page.waitForFunction(() => Array.from(document.images).every((i) => i.complete));
    const header = await page.$eval('header.episode', (h) => ({
      success: h.getAttribute('data-success'),
      steps: h.getAttribute('data-steps'),
      goal: h.querySelector('.goal')?.textContent ?? '',
      text: h.textContent ?? '',
    }));
    assert.equal(header.success, 'true');
    assert.equal(header.steps, '5');
    assert.match(header.goal, /Type your name and press OK\./);
    assert.match(header.text, /tiny-form/);

    const sections = await page.$$eval('section.step', (els) =>
      els.map((s) => {
        const img = s.querySelector('img');
        const svg = s.querySelector('svg.overlay');
        const marker = s.querySelector('g.marker');
        const ring = s.querySelector('g.marker circle.ring');
        const ib = img?.getBoundingClientRect();
        const rb = ring?.getBoundingClientRect();
        return {
          step: Number(s.getAttribute('data-step')),
          action: s.getAttribute('data-action'),
          natural: img ? { w: img.naturalWidth, h: img.naturalHeight } : null,
          viewBox: svg?.getAttribute('viewBox') ?? null,
          marker: marker
            ? {
                gridX: Number(marker.getAttribute('data-grid-x')),
                gridY: Number(marker.getAttribute('data-grid-y')),
                cx: Number(ring!.getAttribute('cx')),
                cy: Number(ring!.getAttribute('cy')),
                // Where the marker is drawn, as a fraction of the displayed image.
                fx: (rb!.left + rb!.width / 2 - ib!.left) / ib!.width,
                fy: (rb!.top + rb!.height / 2 - ib!.top) / ib!.height,
              }
            : null,
          caption: s.querySelector('.caption')?.textContent ?? null,
          terms: Array.from(s.querySelectorAll('table.breakdown tr.term')).map((r) => ({ term: r.getAttribute('data-term'), value: Number(r.getAttribute('data-value')) })),
          total: Number(s.querySelector('table.breakdown tr.total')?.getAttribute('data-value')),
          completion: s.querySelector('pre.completion')?.textContent ?? '',
          action_json: s.querySelector('pre.action')?.textContent ?? '',
          url: s.querySelector('.url')?.textContent ?? '',
          envReward: Number(s.querySelector('.env-reward')?.textContent),
        };
      }),
    );
    assert.equal(sections.length, t.steps.length, 'one section per step');

    for (const [i, s] of sections.entries()) {
      const ts = t.steps[i];
      assert.equal(s.step, ts.step);
      assert.equal(s.action, ts.completion.action.type);
      assert.ok(s.natural && s.natural.w > 0 && s.natural.h > 0, `step ${s.step}: image loaded`);
      assert.deepEqual(s.natural, { w: 640, h: 360 });
      assert.equal(s.viewBox, '0 0 640 360');
      // The reward breakdown: every term that fired, with its value, and the total.
      assert.ok(ts.shaped.terms.length > 0, `step ${s.step} has shaped terms`);
      assert.deepEqual(
        s.terms,
        ts.shaped.terms.map((x) => ({ term: x.term, value: x.value })),
      );
      assert.equal(s.total, ts.shaped.total);
      // The whole text, read from the completion's blob (a version-2 trajectory holds no inline text).
      assert.ok(ts.completion.ref, `step ${s.step}: the text by reference`);
      assert.equal(s.completion, (await blobs.get(ts.completion.ref)).toString('utf8'));
      assert.deepEqual(JSON.parse(s.action_json), ts.completion.action);
      assert.equal(s.url, ts.observation.url);
      assert.equal(s.envReward, ts.reward);
    }

    // click_element: the marker sits at the element's @(x,y) in that step's accessibility tree.
    const axtree0 = (await blobs.get(t.steps[0].observation.axtreeRef)).toString('utf8');
    const a0 = t.steps[0].completion.action as { type: 'click_element'; id: number };
    const centre = findElementCentre(axtree0, a0.id)!;
    const m0 = sections[0].marker!;
    assert.ok(m0, 'click_element has a marker');
    assert.deepEqual([m0.gridX, m0.gridY], [centre.x, centre.y]);
    assert.ok(Math.abs(m0.cx - (centre.x / 1000) * 640) < 0.01 && Math.abs(m0.cy - (centre.y / 1000) * 360) < 0.01);
    assert.ok(Math.abs(m0.fx * 1000 - centre.x) < 3 && Math.abs(m0.fy * 1000 - centre.y) < 3, `drawn at ${m0.fx}, ${m0.fy}`);

    // click: a crosshair at the clicked grid point, mapped onto the image.
    const a2 = t.steps[2].completion.action as { type: 'click'; x: number; y: number };
    const m2 = sections[2].marker!;
    assert.ok(m2, 'click has a marker');
    assert.deepEqual([m2.gridX, m2.gridY], [a2.x, a2.y]);
    assert.ok(Math.abs(m2.cx - (a2.x / 1000) * 640) < 0.01, `cx ${m2.cx}`);
    assert.ok(Math.abs(m2.cy - (a2.y / 1000) * 360) < 0.01, `cy ${m2.cy}`);
    assert.ok(Math.abs(m2.fx * 1000 - a2.x) < 3 && Math.abs(m2.fy * 1000 - a2.y) < 3, `drawn at ${m2.fx}, ${m2.fy}`);

    // Typing, invalid output and the answer get captions instead of a marker.
    assert.equal(sections[1].marker, null);
    assert.match(sections[1].caption!, /type "Ada"/);
    assert.equal(sections[3].marker, null);
    assert.match(sections[3].caption!, /invalid output/);
    assert.equal(sections[4].marker, null);
    assert.match(sections[4].caption!, /answer "Pressed OK after typing Ada\."/);
    assert.deepEqual(
      sections[3].terms.map((x) => x.term),
      t.steps[3].shaped.terms.map((x) => x.term),
    );
    assert.ok(sections[3].terms.some((x) => x.term === 'invalid_action'));
    assert.ok(sections[4].terms.some((x) => x.term === 'task_success'));

    // The page after the last step is shown too.
    const finalLoaded = await page.$eval('section.final img', (i) => (i as HTMLImageElement).naturalWidth);
    assert.equal(finalLoaded, 640);
  } finally {
    await page.close();
  }
});

function metricsLine(iteration: number, loss: number | null): MetricsLine {
  return {
    run_id: 'viewer-run',
    iteration,
    time: new Date(Date.UTC(2026, 10, 21, 12, iteration)).toISOString(),
    algorithm: 'grpo',
    mean_reward: 0.5 + iteration * 0.75,
    reward_std: 0.3,
    frac_reward_zero_std: 0.5 - iteration * 0.1,
    episode_length: 4,
    success_rate: Math.min(1, iteration * 0.3),
    mean_return: 1,
    action_validity: 0.6 + iteration * 0.1,
    loss,
    grad_norm: loss === null ? null : 0.8,
    adapter_version: loss === null ? 0 : iteration,
    tokens: 1000,
    ...(loss === null ? {} : { kl: 0.01 * iteration, clip_fraction: 0.125, entropy: 2 - iteration * 0.1 }),
    ...(iteration === 2 ? { eval: { success_rate: 0.75, mean_return: 1, episodes: 4 } } : {}),
    seconds: { rollout: 10, update: 2 },
    num_groups: 4,
    num_episodes: 2,
  };
}

test('the run report draws the learning curve and the learner charts with Vega-Lite: every value a point, a valid PNG per chart', async () => {
  const runDir = join(work, 'runs', 'viewer-run');
  mkdirSync(runDir, { recursive: true });
  const lines = [metricsLine(0, null), metricsLine(1, 0.42), metricsLine(2, 0.31), metricsLine(3, -0.05)];
  // A torn last line (no newline) is ignored, as the metrics reader specifies.
  writeFileSync(join(runDir, 'metrics.jsonl'), lines.map(formatMetricsLine).join('') + '{"run_id":"viewer-run","itera');
  const outDir = join(work, 'report-out');
  const res = await writeRunReport({ runId: 'viewer-run', metricsPath: join(runDir, 'metrics.jsonl'), outDir });
  assert.equal(res.iterations, 4);
  assert.equal(res.html, join(outDir, 'report.html'));
  const html = readFileSync(res.html, 'utf8');
  assert.doesNotMatch(html, /<script[^>]*\bsrc=/, 'the page loads nothing: the charts are inline SVG');

  // Every metric drawn, with its (iteration, value) pairs; null values (no update in iteration 0) are no points.
  const get = (l: MetricsLine, key: string): number | null => {
    const v = key === 'eval.success_rate' ? l.eval?.success_rate : (l as unknown as Record<string, unknown>)[key];
    return typeof v === 'number' ? v : null;
  };
  const expected = (key: string) => lines.flatMap((l) => (get(l, key) === null ? [] : [[l.iteration, get(l, key)] as [number, number]]));
  const drawn: Record<string, string[]> = {
    learning_curve: ['success_rate', 'action_validity', 'eval.success_rate', 'mean_reward'],
    learner: ['loss', 'grad_norm', 'kl', 'clip_fraction', 'entropy'],
    signal: ['frac_reward_zero_std', 'reward_std'],
  };
  assert.deepEqual(
    expected('loss').map(([i]) => i),
    [1, 2, 3],
  );
  assert.deepEqual(expected('eval.success_rate'), [[2, 0.75]]);

  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  try {
    await page.goto(pathToFileURL(res.html).href);
    const charts = await page.$$eval('figure.chart', (figs) =>
      figs.map((f) => {
        const svg = f.querySelector('.vega-svg svg');
        const box = svg?.getBoundingClientRect();
        return {
          id: f.getAttribute('data-chart'),
          spec: JSON.parse(f.querySelector('script.vega-lite-spec')?.textContent ?? 'null'),
          width: box?.width ?? 0,
          height: box?.height ?? 0,
          points: Array.from(f.querySelectorAll('path[aria-roledescription="point"]')).map((p) => ({
            label: p.getAttribute('aria-label') ?? '',
            y: Number(/translate\([^,]+,([^)]+)\)/.exec(p.getAttribute('transform') ?? '')?.[1]),
          })),
          titles: Array.from(f.querySelectorAll('.role-title-text text, .role-title text')).map((t) => t.textContent),
        };
      }),
    );
    assert.deepEqual(
      charts.map((c) => c.id),
      REPORT_CHARTS.map((c) => c.id),
    );
    assert.equal(charts[0].id, 'learning_curve', 'the learning curve comes first');
    assert.ok(charts[0].width >= 700, `the learning curve is wide (${charts[0].width}px)`);
    for (const c of charts) {
      assert.ok(c.width > 300 && c.height > 150, `${c.id}: a drawn SVG (${c.width}x${c.height})`);
      assert.match(c.spec.$schema, /vega-lite\/v6/);
      // The spec's inline data holds every value of every metric drawn.
      const panels: { data: { values: { iteration: number; metric: string; value: number | null }[] } }[] = c.spec.concat ?? c.spec.vconcat ?? [c.spec];
      const rows = panels.flatMap((p) => p.data.values);
      for (const key of drawn[c.id!]) {
        const fromSpec = rows.filter((r) => r.metric === key && r.value !== null).map((r) => [r.iteration, r.value]);
        assert.deepEqual(fromSpec, expected(key), `${c.id}: ${key} in the spec`);
        // One point per value in the SVG, labelled with its iteration and metric.
        const pts = c.points.filter((p) => p.label.includes(`metric: ${key};`));
        assert.deepEqual(
          pts.map((p) => Number(/^iteration: (\d+)/.exec(p.label)?.[1])),
          expected(key).map(([i]) => i),
          `${c.id}: ${key} points`,
        );
      }
      const keys = new Set(rows.map((r) => r.metric));
      assert.deepEqual([...keys].sort(), [...drawn[c.id!]].sort(), `${c.id}: no other series (mean_ratio has no values in this run)`);
    }
    // Higher values are drawn higher (smaller y): mean_reward grows with the iteration.
    const mr = charts[0].points.filter((p) => p.label.includes('metric: mean_reward;')).map((p) => p.y);
    assert.equal(mr.length, 4);
    assert.ok(
      mr.every((y, i) => i === 0 || y < mr[i - 1]),
      `mean_reward points rise: ${mr}`,
    );
  } finally {
    await page.close();
  }

  assert.deepEqual(Object.keys(res.pngs).sort(), REPORT_CHARTS.map((c) => c.id).sort());
  for (const c of REPORT_CHARTS) {
    const path = join(outDir, `${c.id}.png`);
    assert.equal(res.pngs[c.id], path);
    const info = pngInfo(readFileSync(path));
    assert.ok(info.width > 600 && info.height > 300, `${c.id}.png is ${info.width}x${info.height}`);
  }
  assert.ok(pngInfo(readFileSync(res.pngs.learning_curve)).width >= 1400, 'the learning curve PNG is rendered at twice its size');
});

test("an MCTS run's report, from the mcts-metrics.jsonl of a run from before too: its own charts and numbers", async () => {
  const legacyLine = (iteration: number, pairs: number) =>
    JSON.stringify({
      run_id: 'mcts-old',
      iteration,
      time: '2026-11-21T12:00:00.000Z',
      searches: 2,
      simulations: 12,
      nodes: 9,
      best_path_success_rate: iteration / 4,
      pairs,
      mean_abs_delta_q: 0.3,
      pairs_with_ref_logprobs: 0,
      dpo_loss: 0.69 - iteration * 0.1,
      reward_margin: 0.1,
      accuracy: 0.5,
      grad_norm: 1,
      adapter_version: iteration,
      update_skipped: false,
      candidates: 6,
      invalid_candidates: 1,
      critic_calls: 2,
      critic_failures: 0,
      session_rebuilds: 0,
      eval_success_rate: null,
      seconds: { search: 5 },
    }) + '\n';
  const runDir = join(work, 'runs', 'mcts-old');
  mkdirSync(runDir, { recursive: true });
  writeFileSync(join(runDir, 'mcts-metrics.jsonl'), legacyLine(1, 3) + legacyLine(2, 5));
  const { runId, metricsPath } = resolveRunMetrics(parseConfig({}), runDir);
  assert.deepEqual([runId, metricsPath], ['mcts-old', join(runDir, 'mcts-metrics.jsonl')]);
  const res = await writeRunReport({ runId, metricsPath, png: false });
  assert.equal(res.iterations, 2);
  const html = readFileSync(res.html, 'utf8');
  assert.deepEqual(
    [...html.matchAll(/<figure class="chart" id="chart-([a-z_]+)"/g)].map((m) => m[1]),
    MCTS_REPORT_CHARTS.map((c) => c.id),
  );
  assert.match(html, /MCTS · 2 iterations/);
  assert.match(html, /<b data-metric="mcts\.pairs">3 → 5<\/b>/);
  assert.match(html, /<b data-metric="success_rate">25\.0% → 50\.0%<\/b>/);
  const specs = [...html.matchAll(/<script type="application\/vnd\.vegalite\+json" class="vega-lite-spec" data-chart="([a-z_]+)">(.*?)<\/script>/g)];
  const values = (chart: string, metric: string) => {
    const spec = JSON.parse(specs.find((m) => m[1] === chart)![2]);
    const panels: { data: { values: { iteration: number; metric: string; value: number | null }[] } }[] = spec.concat ?? [spec];
    return panels
      .flatMap((p) => p.data.values)
      .filter((v) => v.metric === metric)
      .map((v) => [v.iteration, v.value]);
  };
  assert.deepEqual(values('search', 'mcts.pairs'), [
    [1, 3],
    [2, 5],
  ]);
  assert.deepEqual(
    values('learner', 'loss').map(([i, v]) => [i, Number(v!.toFixed(2))]),
    [
      [1, 0.59],
      [2, 0.49],
    ],
  );
  assert.deepEqual(values('learning_curve', 'success_rate'), [
    [1, 0.25],
    [2, 0.5],
  ]);
});

test('a run without a metrics file gets a clear error', async () => {
  await assert.rejects(
    writeRunReport({ runId: 'nope', metricsPath: join(work, 'runs', 'nope', 'metrics.jsonl'), png: false }),
    (err: Error) => err instanceof NoMetricsError && /run nope has no metrics file: .*metrics\.jsonl does not exist/.test(err.message),
  );
  mkdirSync(join(work, 'runs', 'empty'), { recursive: true });
  writeFileSync(join(work, 'runs', 'empty', 'metrics.jsonl'), '');
  await assert.rejects(writeRunReport({ runId: 'empty', metricsPath: join(work, 'runs', 'empty', 'metrics.jsonl'), png: false }), /has no metrics yet/);
});

describe('halo view by workflow id, on a real Temporal stack', () => {
  let stack: TestStack;
  let policy: FakePolicyServer;
  before(async () => {
    policy = await startFakePolicyServer({ kind: 'scripted' });
    stack = await startTestStack({ browserWorkers: 1 });
  });
  after(async () => {
    await stack?.stop();
    await policy?.close();
  });

  test('a finished episode is found by its workflow id; running and unknown ids get clear errors', async () => {
    const cfg = parseConfig({
      temporal: { address: stack.address, namespace: stack.namespace, controlTaskQueue: stack.controlQueue, browserTaskQueue: stack.browserQueue },
      stack: { home: stack.home },
      policy: { baseUrl: policy.url, model: 'fake-qwen', timeoutMs: 10_000 },
      episode: { task: 'click-button', seed: 3, maxSteps: 5, sessionStartTimeoutMs: 5_000, heartbeatTimeoutMs: 3_000 },
    });
    const id = `view-test-${Date.now()}`;
    const result = (await stack.client.workflow.execute('episode', { taskQueue: stack.controlQueue, workflowId: id, args: [singleEpisodeInput(cfg, id)] })) as EpisodeResult;
    assert.equal(result.success, true);

    const src = await resolveEpisodeSource(cfg, id);
    assert.equal(src.trajectory, result.trajectoryRef);
    assert.equal(src.workflowId, id);
    const out = join(work, 'views', `${id}.html`);
    const res = await writeEpisodeView({ trajectory: src.trajectory, blobs: src.blobs, out });
    assert.equal(res.workflowId, id);
    assert.equal(res.steps, result.steps);

    const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
    try {
      await page.goto(pathToFileURL(out).href);
      await page.waitForFunction(() => Array.from(document.images).every((i) => i.complete));
      const steps = await page.$$eval('section.step', (els) =>
        els.map((s) => ({
          width: (s.querySelector('img') as HTMLImageElement | null)?.naturalWidth ?? 0,
          marker: s.querySelector('g.marker') !== null,
          terms: Array.from(s.querySelectorAll('tr.term')).map((r) => r.getAttribute('data-term')),
        })),
      );
      assert.equal(steps.length, result.steps);
      assert.ok(
        steps.every((s) => s.width === 1280),
        'MiniWoB screenshots are 1280 wide',
      );
      assert.ok(steps[0].marker, 'the click is drawn');
      assert.ok(steps[steps.length - 1].terms.includes('task_success'));
    } finally {
      await page.close();
    }

    // The trajectory file itself (a path in the blob store) works too, and finds its blob store.
    const byPath = await resolveEpisodeSource(parseConfig({}), new BlobStore(join(stack.home, 'blobs')).pathOf(result.trajectoryRef));
    assert.equal(byPath.blobs.root, join(stack.home, 'blobs'));

    // An episode nobody runs (no worker polls its queue) is still running: no trajectory yet.
    const stuck = `view-test-stuck-${Date.now()}`;
    const handle = await stack.client.workflow.start('episode', { taskQueue: `nobody-${Date.now()}`, workflowId: stuck, args: [singleEpisodeInput(cfg, stuck)] });
    try {
      await assert.rejects(resolveEpisodeSource(cfg, stuck), /still running/);
    } finally {
      await handle.terminate('test done');
    }
    await assert.rejects(resolveEpisodeSource(cfg, stuck), /ended terminated: it has no trajectory/);
    await assert.rejects(resolveEpisodeSource(cfg, 'no-such-episode-anywhere'), /neither a trajectory file, a blob reference .* nor a workflow/);
  });
});
