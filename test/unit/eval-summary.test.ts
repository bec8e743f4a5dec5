import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { parseConfig } from '../../lib/config/config';
import { mctsParams } from '../../lib/search/mcts-params';
import { ConfigError } from '../../lib/config/config-error';
import { adapterFromPath, baselineSkipReason, parseEvalConfig } from '../../lib/eval/eval-config';
import { loadEvalConfigFile, resolveEvalPlanOnHost as resolveEvalPlan } from '../../host/eval-config-file';
import { formatSuccess, median, summarizeEval, summaryJson, summaryMarkdown, wilsonInterval, type EvalEpisodeRecord } from '../../lib/eval/eval-summary';
import { evalEpisodeId } from '../../workflows/evaluate';

const close = (a: number, b: number, eps = 5e-5) => assert.ok(Math.abs(a - b) < eps, `${a} ≉ ${b}`);

test('Wilson 95% interval: hand-computed values', () => {
  // z = 1.959964, z² = 3.841459.
  // 5/10: centre (0.5 + 0.192073) / 1.384146 = 0.5; half = 1.959964/1.384146 · sqrt(0.025 + 0.009604) = 0.263411.
  let w = wilsonInterval(5, 10);
  close(w.low, 0.236589);
  close(w.high, 0.763411);
  // 0/10: [0, z²/n / (1 + z²/n)] = [0, 0.384146/1.384146].
  w = wilsonInterval(0, 10);
  assert.equal(w.low, 0);
  close(w.high, 0.27753);
  // 10/10 mirrors 0/10.
  w = wilsonInterval(10, 10);
  close(w.low, 0.72247);
  assert.equal(w.high, 1);
  // 1/2: centre (0.5 + 0.960365)/2.920730 = 0.5; half = 1.959964/2.920730 · sqrt(0.125 + 0.240091) = 0.405465.
  w = wilsonInterval(1, 2);
  close(w.low, 0.094535);
  close(w.high, 0.905465);
  // 8/20: p = 0.4; centre (0.4 + 0.096036)/1.192073 = 0.416111;
  // half = 1.959964/1.192073 · sqrt(0.012 + 0.002401) = 0.197314.
  w = wilsonInterval(8, 20);
  close(w.low, 0.218798);
  close(w.high, 0.613425);
  // n = 0 carries no information.
  assert.deepEqual(wilsonInterval(0, 0), { low: 0, high: 1 });
  assert.throws(() => wilsonInterval(3, 2), RangeError);
});

test('median: odd, even, empty, unsorted', () => {
  assert.equal(median([3, 1, 2]), 2);
  assert.equal(median([4, 1, 3, 2]), 2.5);
  assert.equal(median([7]), 7);
  assert.equal(median([]), null);
  assert.equal(median([5, 5, 1, 10]), 5);
});

function ep(mode: string, site: string, task: string, seed: number, o: Partial<EvalEpisodeRecord> = {}): EvalEpisodeRecord {
  return {
    mode,
    task,
    site,
    seed,
    workflowId: evalEpisodeId('ev', mode, task, seed),
    success: false,
    reward: 0,
    shapedReturn: 0,
    steps: 3,
    validActions: 3,
    actionValidity: 1,
    done: true,
    reason: null,
    ...o,
  };
}

test('grouping by mode and site, all-row for several sites, errors count as failures', () => {
  const episodes = [
    ep('qwen3vl_base', 'gomail', 'gomail-1', 0, { success: true, reward: 1, shapedReturn: 10.2, steps: 4, validActions: 3 }),
    ep('qwen3vl_base', 'gomail', 'gomail-1', 1, { steps: 2, validActions: 0, shapedReturn: -1 }),
    ep('qwen3vl_base', 'omnizon', 'omnizon-3', 0, { success: true, reward: 1, steps: 6, validActions: 6, shapedReturn: 11 }),
    ep('openai_baseline', 'gomail', 'gomail-1', 0, { error: 'policy request rejected: HTTP 401', steps: 0, validActions: 0 }),
    ep('openai_baseline', 'gomail', 'gomail-1', 1, { success: true, reward: 1, steps: 5, validActions: 5, shapedReturn: 12 }),
  ];
  const s = summarizeEval({
    evalId: 'ev',
    env: 'real',
    modes: ['openai_baseline', 'qwen3vl_base'],
    episodes,
    skipped: [{ mode: 'qwen3vl_mcts', reason: 'because' }],
  });
  assert.deepEqual(s.modes, ['openai_baseline', 'qwen3vl_base']);
  assert.deepEqual(
    s.rows.map((r) => [r.mode, r.site, r.n, r.successes, r.errors]),
    [
      ['openai_baseline', 'gomail', 2, 1, 1],
      ['qwen3vl_base', 'gomail', 2, 1, 0],
      ['qwen3vl_base', 'omnizon', 1, 1, 0],
      ['qwen3vl_base', 'all', 3, 2, 0],
    ],
  );
  const [oa, gm, , all] = s.rows;
  // The failed episode counts in n (success 1/2) but not in steps, reward, validity.
  assert.equal(oa.successRate, 0.5);
  assert.equal(oa.medianSteps, 5);
  assert.equal(oa.meanReward, 1);
  assert.equal(oa.actionValidity, 1);
  assert.equal(gm.medianSteps, 3);
  assert.equal(gm.meanReward, 0.5);
  close(gm.meanShapedReturn!, 4.6);
  assert.equal(gm.actionValidity, 0.5); // 3 valid of 6 actions, pooled
  assert.equal(all.medianSteps, 4);
  close(all.successRate, 0.666667);
  close(all.actionValidity!, 0.75); // 9 of 12
  close(all.ci95.low, wilsonInterval(2, 3).low, 1e-6);
  // A mode whose every episode failed: no step statistics.
  const failed = summarizeEval({ evalId: 'x', env: 'miniwob', modes: ['m'], episodes: [ep('m', 'miniwob', 't', 0, { error: 'boom' })] });
  assert.deepEqual(
    { n: failed.rows[0].n, med: failed.rows[0].medianSteps, mr: failed.rows[0].meanReward, v: failed.rows[0].actionValidity },
    { n: 1, med: null, mr: null, v: null },
  );
});

test('markdown: the table, the skipped section, notes; JSON round-trips', () => {
  const s = summarizeEval({
    evalId: 'ev',
    env: 'miniwob',
    modes: ['qwen3vl_base', 'openai_baseline'],
    episodes: [
      ep('qwen3vl_base', 'miniwob', 'click-button', 0, { steps: 5, validActions: 0, shapedReturn: -2.5 }),
      ep('openai_baseline', 'miniwob', 'click-button', 0, { success: true, reward: 0.8, steps: 1, validActions: 1 }),
      ep('openai_baseline', 'miniwob', 'enter-text', 0, { success: true, reward: 0.6, steps: 2, validActions: 2 }),
    ],
    skipped: [{ mode: 'gpt5', reason: 'no API key: OPENAI_API_KEY is not set' }],
    notes: [{ mode: 'qwen3vl_mcts', note: 'adapter mcts-local/v2 evaluated' }],
    modeDetails: [{ mode: 'openai_baseline', describe: 'gpt-4o at https://api.openai.com/v1' }],
  });
  const md = summaryMarkdown(s);
  const lines = md.split('\n');
  assert.ok(lines.includes('| mode | site | n | success (95% CI) | median steps | mean reward | validity |'));
  assert.ok(lines.includes('| qwen3vl_base | miniwob | 1 | 0.0% (0.0–79.3%) | 5.0 | 0.000 | 0.0% |'), md);
  assert.ok(lines.includes('| openai_baseline | miniwob | 2 | 100.0% (34.2–100.0%) | 1.5 | 0.700 | 100.0% |'), md);
  assert.match(md, /### Skipped\n\n- gpt5: no API key: OPENAI_API_KEY is not set/);
  assert.match(md, /### Notes\n\n- qwen3vl_mcts: adapter mcts-local\/v2 evaluated/);
  assert.match(md, /### Modes\n\n- openai_baseline: gpt-4o at https:\/\/api\.openai\.com\/v1/);
  assert.equal(formatSuccess({ successRate: 0.5, ci95: wilsonInterval(5, 10) }), '50.0% (23.7–76.3%)');
  assert.deepEqual(JSON.parse(summaryJson(s)), s);
  // Nothing ran: said so, and the skipped section is still there.
  const none = summaryMarkdown(summarizeEval({ evalId: 'e', env: 'miniwob', modes: [], episodes: [], skipped: [{ mode: 'openai_baseline', reason: 'r' }] }));
  assert.match(none, /No episodes were run\./);
  assert.match(none, /- openai_baseline: r/);
  // A pipe in a cell cannot break the table.
  assert.match(summaryMarkdown({ ...s, skipped: [{ mode: 'a|b', reason: 'x\ny' }] }), /- a\\\|b: x y/);
});

test('a REAL summary names the scoring its episodes were judged under; records of two scorings are refused', () => {
  const official = summarizeEval({ evalId: 'r', env: 'real', modes: ['m'], episodes: [ep('m', 'gomail', 'gomail-1', 0, { scoring: 'official' })] });
  assert.equal(official.scoring, 'official');
  assert.match(summaryMarkdown(official), /^## Evaluation r \(real, official scoring\)$/m);
  assert.equal(summarizeEval({ evalId: 'm', env: 'miniwob', modes: ['m'], episodes: [ep('m', 'miniwob', 'click-button', 0)] }).scoring, undefined);
  assert.throws(
    () =>
      summarizeEval({
        evalId: 'x',
        env: 'real',
        modes: ['m'],
        episodes: [ep('m', 'gomail', 'gomail-1', 0, { scoring: 'official' }), ep('m', 'gomail', 'gomail-2', 0, { scoring: 'training' })],
      }),
    /mix REAL scorings \(official, training\)/,
  );
});

// ---- eval config (lib/eval/eval-config.ts) -------------------------------------------------------------------

const base = parseConfig({ policy: { model: 'tiny-random', maxTokens: 48 }, train: { gpuTaskQueue: 'gpu-x' } });

test('eval config: defaults, and configs/eval-default.yaml is valid', () => {
  const c = parseEvalConfig({});
  assert.equal(c.runId, 'eval-local');
  assert.deepEqual(
    c.modes.map((m) => m.name),
    ['qwen3vl_base', 'qwen3vl_grpo', 'qwen3vl_mcts', 'openai_baseline'],
  );
  const { config, haloConfigPath } = loadEvalConfigFile(join(__dirname, '..', '..', 'configs', 'eval-default.yaml'));
  assert.equal(config.env, 'miniwob');
  assert.equal(config.maxSteps, 5);
  assert.deepEqual(config.seeds, [0, 1]);
  assert.ok(haloConfigPath?.endsWith(join('configs', 'default.yaml')));
  const mcts = config.modes.find((m) => m.name === 'qwen3vl_mcts');
  assert.ok(mcts && 'testTimeMcts' in mcts && mcts.testTimeMcts?.simulations === 4 && mcts.testTimeMcts.critic?.backend === 'none');
});

test('eval config: errors name every bad field', () => {
  assert.throws(
    () =>
      parseEvalConfig({
        env: 'web',
        seeds: [1, 1],
        modes: [
          { name: 'qwen3vl_base', adapter: { run: 'x', version: -1 } },
          { name: 'qwen3vl_sft' },
          { name: 'qwen3vl_grpo', adapter: { path: 'nowhere' } },
          { name: 'openai_baseline' },
          { name: 'openai_baseline', baseUrl: 'not a url' },
          { name: 'qwen3vl_base', testTimeMcts: { simulations: 4 } },
        ],
      }),
    (err: Error) => {
      assert.ok(err instanceof ConfigError);
      for (const re of [
        /env:/,
        /seeds\.1: seed 1 is listed twice/,
        /modes\.0\.adapter\.version/,
        /modes\.1\.name: name must be one of/,
        /modes\.2\.adapter\.path/,
        /modes\.4\.baseUrl/,
        /modes\.5.*testTimeMcts/,
      ]) {
        assert.match(err.message, re);
      }
      return true;
    },
  );
  assert.throws(
    () => parseEvalConfig({ tasks: ['a', 'b', 'a'], modes: [{ name: 'openai_baseline' }, { name: 'qwen3vl_base' }, { name: 'openai_baseline', model: 'gpt-5' }] }),
    (err: Error) => {
      assert.match(err.message, /tasks\.2: task "a" is listed twice/);
      assert.match(err.message, /modes\.2\.label: mode label "openai_baseline" is already used by modes\.0/);
      return true;
    },
  );
});

test('plan: greedy policies, adapters (latest / pinned / path), skip reasons, notes', () => {
  const cfg = parseEvalConfig({
    runId: 'ev1',
    tasks: ['click-button'],
    seeds: [3],
    modes: [
      { name: 'qwen3vl_base' },
      { name: 'qwen3vl_grpo' },
      { name: 'qwen3vl_mcts', adapter: { path: '/ckpt/mcts-a/v2' }, testTimeMcts: { critic: { backend: 'none' } } },
      { name: 'qwen3vl_grpo', label: 'grpo_vllm', backend: 'openai', adapter: { run: 'grpo-local', version: 4 }, baseUrl: 'http://10.0.0.2:8000/v1' },
      { name: 'openai_baseline' },
      { name: 'openai_baseline', label: 'local_compat', baseUrl: 'http://127.0.0.1:9999/v1', model: 'fake' },
      { name: 'openai_baseline', label: 'with_key', credential: 'critic' },
    ],
  });
  const plan = resolveEvalPlan(cfg, base, {
    env: { HALO_CREDENTIAL_CRITIC_ENV: 'MY_KEY', MY_KEY: 'sk-test' },
    listAdapterVersions: (run) => (run === 'grpo-local' ? [1, 2, 4, 5] : []),
    miniwobTasks: ['click-button', 'enter-text'],
  });
  assert.equal(plan.evalId, 'ev1');
  assert.equal(plan.run.gpuTaskQueue, 'gpu-x');
  assert.deepEqual(plan.tasks, [{ task: 'click-button', site: 'miniwob' }]);
  const by = Object.fromEntries(plan.modes.map((m) => [m.label, m]));
  assert.deepEqual(Object.keys(by), ['qwen3vl_base', 'qwen3vl_grpo', 'qwen3vl_mcts', 'grpo_vllm', 'local_compat', 'with_key']);
  for (const m of plan.modes) assert.equal(m.policy.temperature, 0);
  assert.deepEqual([by.qwen3vl_base.adapterVersion, by.qwen3vl_base.runId, by.qwen3vl_base.policy.backend], [0, 'ev1', 'colocated']);
  assert.deepEqual([by.qwen3vl_grpo.adapterVersion, by.qwen3vl_grpo.runId], [5, 'grpo-local']);
  assert.deepEqual([by.qwen3vl_mcts.adapterVersion, by.qwen3vl_mcts.runId], [2, 'mcts-a']);
  assert.deepEqual([by.grpo_vllm.policy.backend, by.grpo_vllm.policy.model, by.grpo_vllm.policy.baseUrl], ['openai', 'grpo-local-v4', 'http://10.0.0.2:8000/v1']);
  assert.deepEqual(
    [by.local_compat.policy.model, by.local_compat.policy.credential, by.local_compat.policy.apiKeyEnv, by.local_compat.policy.maxTokens],
    ['fake', 'baseline', undefined, 512],
  );
  assert.equal(by.with_key.policy.credential, 'critic');
  assert.equal(by.with_key.policy.baseUrl, 'https://api.openai.com/v1');
  assert.equal(plan.skipped.length, 1);
  assert.equal(plan.skipped[0].mode, 'openai_baseline');
  assert.match(plan.skipped[0].reason, /no API key: OPENAI_API_KEY \(credential baseline\) is not set/);
  assert.ok(plan.notes.some((n) => n.mode === 'qwen3vl_grpo' && /latest adapter of run grpo-local: v5/.test(n.note)));
  // Test-time MCTS: only the mode that asks for it searches, with the HALO config's mcts section and the mode's
  // budget, judging ended episodes by self-evaluation; without a critic the note says what that means.
  assert.deepEqual(
    plan.modes.filter((m) => m.search).map((m) => m.label),
    ['qwen3vl_mcts'],
  );
  assert.deepEqual(by.qwen3vl_mcts.search, { ...mctsParams(base), numSimulations: 16, critic: null, outcome: 'self-evaluation' });
  assert.match(by.qwen3vl_mcts.describe, /adapter mcts-a\/v2 \+ test-time MCTS \(16 simulations per step\)/);
  const ttNote = plan.notes.find((n) => n.mode === 'qwen3vl_mcts' && /^test-time MCTS/.test(n.note))?.note ?? '';
  assert.match(ttNote, /16 simulations before every step \(K=5, depth ≤ 6, value by rollout, temperature 1; depth also capped at the steps left\)/);
  assert.match(ttNote, /no critic \(critic backend none\): every ended episode counts 0\.5/);
  assert.match(ttNote, /the task's success signal is never read by the search/);
  const withCritic = parseConfig({
    train: { gpuTaskQueue: 'gpu-x' },
    mcts: { maxChildren: 3, critic: { backend: 'openai', baseUrl: 'http://127.0.0.1:8000/v1', model: 'Qwen/Qwen3-VL-8B-Instruct' } },
  });
  const tt = resolveEvalPlan(parseEvalConfig({ modes: [{ name: 'qwen3vl_mcts', adapter: { run: 'm', version: 1 }, testTimeMcts: { simulations: 4, maxDepth: 2 } }] }), withCritic, {
    env: {},
  });
  assert.deepEqual(
    [tt.modes[0].search?.numSimulations, tt.modes[0].search?.maxChildren, tt.modes[0].search?.maxDepth, tt.modes[0].search?.critic?.model],
    [4, 3, 2, 'Qwen/Qwen3-VL-8B-Instruct'],
  );
  assert.match(tt.notes.at(-1)!.note, /ended episodes are judged by the critic Qwen\/Qwen3-VL-8B-Instruct at http:\/\/127\.0\.0\.1:8000\/v1/);
  // Valuing states by a critic needs one.
  assert.throws(
    () =>
      resolveEvalPlan(
        parseEvalConfig({ modes: [{ name: 'qwen3vl_base' }, { name: 'qwen3vl_mcts', testTimeMcts: { critic: { backend: 'none' } } }] }),
        parseConfig({ mcts: { valueMode: 'critic' } }),
        { env: {}, listAdapterVersions: () => [] },
      ),
    /modes\.1\.testTimeMcts\.critic: the search values states by the critic/,
  );

  // No adapter yet: 'latest' falls back to version 0, and says so.
  const empty = resolveEvalPlan(parseEvalConfig({ modes: [{ name: 'qwen3vl_grpo' }] }), base, { env: {}, listAdapterVersions: () => [] });
  assert.equal(empty.modes[0].adapterVersion, 0);
  assert.match(empty.notes[0].note, /^MiniWoB\+\+ settings: time limit raised \(1000000 ms.*reward raw.*success = raw reward 1/);
  assert.match(empty.notes[1].note, /has no adapter .*evaluated version 0/);
  const official = resolveEvalPlan(parseEvalConfig({ modes: [{ name: 'qwen3vl_grpo' }] }), parseConfig({ miniwob: { timeLimit: 'official', reward: 'official' } }), {
    env: {},
    listAdapterVersions: () => [],
  });
  assert.match(official.notes[0].note, /time limit official .*; reward official \(time-scaled\)/);
  assert.deepEqual(official.run.envOptions, {
    realRunId: '0',
    realForkMode: 'snapshot',
    realScoring: 'official',
    evaluateAtCap: false,
    miniwobTimeLimit: 'official',
    miniwobReward: 'official',
  });

  // Unknown MiniWoB task.
  assert.throws(
    () => resolveEvalPlan(parseEvalConfig({ tasks: ['click-buton'] }), base, { env: {}, miniwobTasks: ['click-button'], listAdapterVersions: () => [] }),
    /tasks\.0: unknown MiniWoB task "click-buton"/,
  );
  assert.deepEqual(adapterFromPath('checkpoints/grpo-local/v12/'), { run: 'grpo-local', version: 12 });
  assert.equal(
    baselineSkipReason(parseEvalConfig({ modes: [{ name: 'openai_baseline', baseUrl: 'https://api.openai.com/v1/' }] }).modes[0] as never, {})?.startsWith('no API key'),
    true,
  );
});

test('plan: REAL sites expand into every task under official scoring (the default), an unscorable one counted as a failure; training leaves it out', () => {
  const realSites = {
    gomail: [
      { id: 'gomail-1', site: 'gomail', scorable: true },
      { id: 'gomail-2', site: 'gomail', scorable: true },
    ],
    gocalendar: [
      { id: 'gocalendar-10', site: 'gocalendar', scorable: true },
      { id: 'gocalendar-11', site: 'gocalendar', scorable: false, unscorableReason: 'empty eval script' },
    ],
    omnizon: [{ id: 'omnizon-3', site: 'omnizon', scorable: true }],
  };
  const cfg = parseEvalConfig({ env: 'real', tasks: ['gomail', 'v2.omnizon-3', 'gocalendar', 'gomail-2'], modes: [{ name: 'qwen3vl_base' }] });
  const plan = resolveEvalPlan(cfg, base, { env: {}, realSites });
  assert.deepEqual(plan.tasks, [
    { task: 'gomail-1', site: 'gomail' },
    { task: 'gomail-2', site: 'gomail' },
    { task: 'omnizon-3', site: 'omnizon' },
    { task: 'gocalendar-10', site: 'gocalendar' },
    { task: 'gocalendar-11', site: 'gocalendar' },
  ]);
  assert.equal(plan.run.envOptions?.realScoring, 'official');
  assert.match(plan.notes[0].note, /^REAL scoring: official .*results are local/);
  assert.ok(plan.notes.some((n) => /gocalendar-11 is unscorable .*counted as a failure/.test(n.note)));

  const training = resolveEvalPlan(cfg, parseConfig({ real: { scoring: 'training' } }), { env: {}, realSites });
  assert.equal(training.run.envOptions?.realScoring, 'training');
  assert.match(training.notes[0].note, /^REAL scoring: training .*not comparable/);
  assert.ok(!training.tasks.some((t) => t.task === 'gocalendar-11'));
  assert.ok(training.notes.some((n) => /gocalendar-11 left out of site gocalendar: unscorable/.test(n.note)));
  assert.throws(
    () => resolveEvalPlan(parseEvalConfig({ env: 'real', tasks: ['gomale'] }), base, { env: {}, realSites, listAdapterVersions: () => [] }),
    /tasks\.0: "gomale" is neither a REAL v2 task id nor a site/,
  );
});
