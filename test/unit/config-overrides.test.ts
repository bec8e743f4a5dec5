import { test } from 'node:test';
import assert from 'node:assert/strict';
import { configSchema, parseConfig, type HaloConfig } from '../../lib/config/config';
import { Command } from 'commander';
import { addOverrideOptions, knownLongFlags, runConfigFromFlags } from '../../client/run-flags';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { evalConfigSchema, parseEvalConfig, resolveEvalPlan, type EvalConfig } from '../../lib/eval/eval-config';
import {
  applyEvalOverrides,
  applyRunOverrides,
  flagsOf,
  ALSO_ACCEPTED,
  normalizeFlagSpellings,
  OVERRIDE_FLAGS,
  parseWithFlags,
  sampleTasks,
  splitEpisodeBudget,
  type OverrideFlags,
  type Overridden,
  type SiteTask,
} from '../../client/config-overrides';
import { pinProblems } from '../../client/real-preflight';
import type { RealRegistry, RegistrySnapshot } from '../../env/real-tasks';

const sites: Record<string, SiteTask[]> = {
  gomail: [
    { id: 'gomail-1', site: 'gomail', scorable: true },
    { id: 'gomail-2', site: 'gomail', scorable: true, caveats: ['runs on another deployment'] },
    { id: 'gomail-3', site: 'gomail', scorable: false },
  ],
  omnizon: [{ id: 'omnizon-3', site: 'omnizon', scorable: true }],
};
const ctx = { realSites: () => sites };

const halo = (o: Overridden): HaloConfig =>
  parseWithFlags(
    o,
    (r) => configSchema.safeParse(r),
    (r) => parseConfig(r, 'test config'),
  );
const train = (flags: OverrideFlags, file: unknown = {}) => halo(applyRunOverrides('train', file, flags, ctx));
const mcts = (flags: OverrideFlags, file: unknown = {}) => halo(applyRunOverrides('mcts', file, flags, ctx));
const evalOf = (flags: OverrideFlags, file: unknown = { modes: [{ name: 'qwen3vl_base' }, { name: 'qwen3vl_mcts' }] }) => {
  const o = applyEvalOverrides(file, {}, flags, ctx);
  return {
    cfg: parseWithFlags(
      o.eval,
      (r) => evalConfigSchema.safeParse(r),
      (r) => parseEvalConfig(r, 'test eval config'),
    ) as EvalConfig,
    base: halo(o.halo),
  };
};

test('every train flag lands at its config path', () => {
  const file = { train: { episodesPerIteration: 8, heldOutTasks: ['gomail-2'], tasks: ['gomail-1'] }, episode: { env: 'real' } };
  const c = train({ tasks: 'click-button,enter-text,focus-text', env: 'miniwob', iterations: '7', numGenerations: '6', lr: '2e-5', temperature: '0.7', seed: '11' }, file);
  assert.deepEqual(c.train.tasks, ['click-button', 'enter-text', 'focus-text']);
  assert.deepEqual(c.train.heldOutTasks, [], 'the file held out tasks of its own list');
  assert.equal(c.episode.env, 'miniwob');
  assert.equal(c.train.iterations, 7);
  assert.equal(c.train.numGenerations, 6);
  assert.equal(c.train.learningRate, 2e-5);
  assert.equal(c.policy.temperature, 0.7);
  assert.equal(c.train.seed, 11);
  assert.equal(train({ task: 'click-link' }).train.tasks.join(), 'click-link');
  const budget = train({ episodes: '20' }, file);
  assert.deepEqual([budget.train.iterations, budget.train.episodesPerIteration], [4, 5]);
  const withIts = train({ episodes: '20', iterations: '3' }, file);
  assert.deepEqual([withIts.train.iterations, withIts.train.episodesPerIteration], [3, 6]);
  const sampled = train({ tasks: 'a,b,c,d,e', sampleSize: '2', seed: '1' });
  assert.equal(sampled.train.tasks.length, 2);
  assert.deepEqual(train({ tasks: 'a,b,c,d,e', sampleSize: '2', seed: '1' }).train.tasks, sampled.train.tasks, 'the draw is deterministic');
});

test('a REAL task or site implies --env real; --domain takes the scorable tasks of the site', () => {
  const one = train({ task: 'v2.omnizon-3' });
  assert.equal(one.episode.env, 'real');
  assert.deepEqual(one.train.tasks, ['omnizon-3'], 'the v2. prefix is dropped');
  const o = applyRunOverrides('train', {}, { domain: 'gomail' }, ctx);
  assert.ok(
    o.notes.some((n) => /gomail-3 \(unscorable\)/.test(n)),
    o.notes.join('\n'),
  );
  const site = halo(o);
  assert.deepEqual([site.episode.env, site.train.tasks], ['real', ['gomail-1', 'gomail-2']]);
  assert.deepEqual(train({ domain: 'gomail,omnizon' }).train.tasks, ['gomail-1', 'gomail-2', 'omnizon-3']);
  assert.throws(() => train({ domain: 'gomial' }), /^ConfigError: --domain: unknown REAL site "gomial" \(sites: gomail, omnizon\)$/);
  assert.throws(() => train({ domain: 'gomail', env: 'miniwob' }), /--domain: REAL sites need --env real/);
  assert.throws(() => train({ task: 'a', tasks: 'b' }), /--task and --tasks/);
});

test('every mcts flag lands at its config path', () => {
  const c = mcts({
    tasks: 'click-button,click-link',
    env: 'miniwob',
    iterations: '2',
    numGenerations: '3',
    lr: '1e-4',
    temperature: '0.9',
    simulations: '12',
    ucbC: '2.5',
    seed: '4',
  });
  assert.deepEqual(c.mcts.tasks, ['click-button', 'click-link']);
  assert.deepEqual(
    [c.episode.env, c.mcts.iterations, c.mcts.maxChildren, c.mcts.learningRate, c.mcts.temperature, c.mcts.numSimulations, c.mcts.ucbConstant, c.mcts.seed],
    ['miniwob', 2, 3, 1e-4, 0.9, 12, 2.5, 4],
  );
  assert.deepEqual(mcts({ domain: 'gomail', sampleSize: '1', seed: '0' }).mcts.tasks.length, 1);
});

test('every eval flag lands at its config path', () => {
  const { cfg, base } = evalOf({ tasks: 'click-button,enter-text,focus-text', env: 'miniwob', seed: '5', simulations: '3', ucbC: '0.5', sampleSize: '2' });
  assert.equal(cfg.tasks.length, 2);
  assert.deepEqual(cfg.seeds, [5]);
  const m = cfg.modes.find((x) => x.name === 'qwen3vl_mcts');
  assert.ok(m && 'testTimeMcts' in m && m.testTimeMcts?.simulations === 3, JSON.stringify(m));
  assert.equal(base.mcts.ucbConstant, 0.5);
  // --domain: agisdk's task set for the site (every task whose name starts with "<site>-"), unscorable ones
  // included under official scoring (the evaluation default), as agisdk counts them.
  const site = evalOf({ domain: 'gomail' });
  assert.deepEqual([site.cfg.env, site.cfg.tasks], ['real', ['gomail']]);
  const plan = (scoring: 'official' | 'training') =>
    resolveEvalPlan(site.cfg, parseConfig({ real: { scoring } }), { env: {}, checkpoints: '/ckpt', listAdapterVersions: () => [], realSites: sites });
  assert.deepEqual(
    plan('official').tasks.map((t) => t.task),
    ['gomail-1', 'gomail-2', 'gomail-3'],
  );
  assert.deepEqual(
    plan('training').tasks.map((t) => t.task),
    ['gomail-1', 'gomail-2'],
  );
  // A task's registry caveat is in the evaluation's notes.
  assert.ok(plan('official').notes.some((n) => n.note === 'gomail-2: runs on another deployment'));
  assert.throws(() => evalOf({ simulations: '3' }, { modes: [{ name: 'qwen3vl_base' }] }), /--simulations: the eval config has no qwen3vl_mcts mode/);
});

// A wrong value of each flag: the error names the flag and says what is wrong.
const bad: [string, OverrideFlags, RegExp][] = [
  ['train', { lr: '0' }, /^--lr: must be > 0$/],
  ['train', { lr: 'fast' }, /^--lr: must be a number, got "fast"$/],
  ['train', { iterations: '0' }, /^--iterations: must be >= 1$/],
  ['train', { iterations: '2.5' }, /^--iterations: must be an integer$/],
  ['train', { numGenerations: '1' }, /^--num-generations: must be >= 2$/],
  ['train', { temperature: '2.5' }, /^--temperature: must be <= 2$/],
  ['train', { env: 'web' }, /^--env: must be one of miniwob, real$/],
  ['train', { episodes: '0' }, /^--episodes: must be >= 1$/],
  ['train', { episodes: '2', iterations: '3' }, /^--episodes: 2 episodes cannot fill 3 iterations/],
  ['train', { episodes: '1e9' }, /^--episodes \(train\.iterations\): must be <= 100000$/],
  ['train', { seed: '-1' }, /^--seed: must be >= 0$/],
  ['train', { sampleSize: '0' }, /^--sample-size: must be >= 1$/],
  ['train', { sampleSize: '9' }, /^--sample-size: must be <= 2 \(the number of tasks to draw from\)$/],
  ['train', { tasks: ' , ' }, /^--tasks: must name at least one task$/],
  ['train', { task: 'a,b' }, /^--task: one task id/],
  ['train', { domain: 'nowhere' }, /^--domain: unknown REAL site/],
  ['train', { lossType: 'grpo' }, /^--loss-type: only dr_grpo is implemented .*got "grpo"$/],
  ['train', { policyUrl: 'localhost' }, /^--policy-url: /],
  ['mcts', { simulations: '0' }, /^--simulations: must be >= 1$/],
  ['mcts', { policyUrl: 'not a url' }, /^--policy-url: /],
  ['mcts', { episodes: '0' }, /^--episodes: must be >= 1$/],
  ['mcts', { episodes: '5', tasks: 'a,b,c,d,e,f' }, /^--episodes: 5 searches cannot cover the 6 searches of one iteration/],
  ['mcts', { ucbC: '-1' }, /^--ucb-c: must be >= 0$/],
  ['mcts', { temperature: '0' }, /^--temperature: must be > 0$/],
  ['mcts', { numGenerations: '0' }, /^--num-generations: must be >= 1$/],
  ['mcts', { lr: '-1' }, /^--lr: must be > 0$/],
  ['mcts', { iterations: 'x' }, /^--iterations: must be a number/],
  ['mcts', { tasks: 'a,a' }, /^--tasks: tasks must be distinct/],
  ['mcts', { seed: '1.5' }, /^--seed: must be an integer$/],
  ['mcts', { env: 'x' }, /^--env: must be one of miniwob, real$/],
  ['mcts', { domain: 'nowhere' }, /^--domain: unknown REAL site/],
  ['mcts', { sampleSize: '0' }, /^--sample-size: must be >= 1$/],
  ['eval', { domain: 'nowhere' }, /^--domain: unknown REAL site/],
  ['eval', { seed: '-2' }, /^--seed: must be >= 0$/],
  ['eval', { simulations: '0' }, /^--simulations: must be >= 1$/],
  ['eval', { ucbC: '-0.1' }, /^--ucb-c: must be >= 0$/],
  ['eval', { env: 'x' }, /^--env: must be one of miniwob, real$/],
  ['eval', { tasks: 'a,a' }, /^--tasks: task "a" is listed twice$/],
  ['eval', { sampleSize: '99' }, /^--sample-size: must be <= \d+/],
];

test('a wrong value is an error naming the flag', () => {
  for (const [command, flags, expected] of bad) {
    const run = () => (command === 'eval' ? evalOf(flags) : command === 'train' ? train(flags, { train: { tasks: ['x', 'y'] } }) : mcts(flags));
    assert.throws(run, (err: Error) => {
      assert.equal(err.name, 'ConfigError', `${command} ${JSON.stringify(flags)}: ${err.message}`);
      assert.match(err.message, expected, `${command} ${JSON.stringify(flags)}`);
      return true;
    });
  }
  // Every flag of every command has a wrong-value case above.
  for (const c of ['train', 'mcts', 'eval'] as const) {
    for (const f of flagsOf(c)) {
      if (f.key === 'task') continue;
      assert.ok(
        bad.some(([cmd, flags]) => cmd === c && f.key in flags),
        `${c} ${f.flag} has a wrong-value case`,
      );
    }
  }
  assert.ok(OVERRIDE_FLAGS.length >= 13);
});

test("the file's own mistakes keep their usual message", () => {
  assert.throws(() => train({ lr: '0.1' }, { train: { iterations: -1 } }), /invalid test config:\n\s+train\.iterations/);
});

test('an episode budget is split into iterations × episodes, never more than the budget', () => {
  assert.deepEqual(splitEpisodeBudget(20, 8), { iterations: 4, episodesPerIteration: 5 });
  assert.deepEqual(splitEpisodeBudget(23, 8), { iterations: 3, episodesPerIteration: 7 });
  assert.deepEqual(splitEpisodeBudget(16, 8), { iterations: 2, episodesPerIteration: 8 });
  assert.deepEqual(splitEpisodeBudget(3, 8), { iterations: 1, episodesPerIteration: 3 });
  assert.deepEqual(splitEpisodeBudget(6, 2), { iterations: 3, episodesPerIteration: 2 });
  assert.deepEqual(splitEpisodeBudget(20, 8, 2), { iterations: 2, episodesPerIteration: 10 });
  for (let budget = 1; budget <= 60; budget++) {
    for (const per of [1, 2, 4, 8, 16]) {
      const s = splitEpisodeBudget(budget, per);
      assert.ok(s.iterations * s.episodesPerIteration <= budget, `${budget}/${per}`);
      assert.ok(s.episodesPerIteration <= per && s.episodesPerIteration >= Math.min(budget, Math.ceil(per / 2)), `${budget}/${per}: ${JSON.stringify(s)}`);
    }
  }
});

test('a sample keeps the list order and depends on the seed', () => {
  const list = Array.from({ length: 20 }, (_, i) => `t${i}`);
  const a = sampleTasks(list, 5, 1);
  assert.equal(a.length, 5);
  assert.deepEqual(
    a,
    [...a].sort((x, y) => list.indexOf(x) - list.indexOf(y)),
  );
  assert.notDeepEqual(sampleTasks(list, 5, 2), a);
});

test('a pinned registry: the same scripts pass, a changed sha256, script, goal or a missing task is named', () => {
  const installed = {
    agisdkVersion: '0.3.5',
    byId: new Map([
      ['gomail-1', { id: 'gomail-1', evalScript: 'eval_gomail_1.py', evalSha256: 'a'.repeat(64), goal: 'Send a mail', startUrl: 'https://g/' }],
      ['gomail-2', { id: 'gomail-2', evalScript: 'eval_gomail_2.py', evalSha256: 'b'.repeat(64), goal: 'Read', startUrl: 'https://g/' }],
    ]),
  } as unknown as RealRegistry;
  const snap: RegistrySnapshot = {
    agisdk_version: '0.3.5',
    tasks: [
      { id: 'gomail-1', goal: 'Send a mail', site: 'gomail', start_url: 'https://g/', eval_script: 'eval_gomail_1.py', eval_sha256: 'a'.repeat(64), scorable: true },
      { id: 'gomail-2', goal: 'Read', site: 'gomail', start_url: 'https://g/', eval_script: 'eval_gomail_2.py', eval_sha256: 'b'.repeat(64), scorable: true },
    ],
  };
  assert.deepEqual(pinProblems(snap, 'snap.json', ['v2.gomail-1', 'gomail-2'], installed), []);
  const tampered = structuredClone(snap);
  tampered.tasks[1].eval_sha256 = 'c'.repeat(64);
  tampered.tasks[0].goal = 'Delete every mail';
  const problems = pinProblems(tampered, 'snap.json', ['gomail-1', 'gomail-2', 'gomail-9'], installed);
  assert.equal(problems.length, 3, problems.join('\n'));
  assert.match(problems[0], /^task gomail-1: its goal differs/);
  assert.match(problems[1], /^task gomail-2: eval script eval_gomail_2\.py has sha256 bbbbbbbbbbbb… in the installed agisdk 0\.3\.5, snap\.json pins cccccccccccc…$/);
  assert.match(problems[2], /^task gomail-9 is not in the pinned registry snap\.json/);
});

test("the seeds' spellings: --policy_url / --policy-url, --loss_type / --loss-type, and underscores for every flag", () => {
  const program = new Command('halo').option('-c, --config <file>');
  for (const c of ['train', 'mcts', 'eval'] as const) addOverrideOptions(program.command(c), c, () => ({ file: 'x.yaml', values: {} }));
  program.command('episode').option('--policy-url <url>').option('--max-steps <n>');
  const known = knownLongFlags(program);
  const argv = [
    'node',
    'halo',
    'train',
    '--policy_url',
    'http://h:8000/v1',
    '--loss_type=dr_grpo',
    '--num_generations',
    '8',
    '--sample_size',
    '3',
    '--task_registry',
    'snap_file.json',
    '--tasks',
    'click_button',
    '--not_a_flag',
    '1',
    '--',
    '--num_generations',
  ];
  assert.deepEqual(normalizeFlagSpellings(argv, known), [
    'node',
    'halo',
    'train',
    '--policy-url',
    'http://h:8000/v1',
    '--loss-type=dr_grpo',
    '--num-generations',
    '8',
    '--sample-size',
    '3',
    '--task-registry',
    'snap_file.json',
    '--tasks',
    'click_button',
    '--not_a_flag',
    '1',
    '--',
    '--num_generations',
  ]);
  assert.deepEqual(normalizeFlagSpellings(['mcts', '--ucb_c', '2', '--episodes', '9'], known), ['mcts', '--ucb-c', '2', '--episodes', '9']);
  assert.deepEqual(normalizeFlagSpellings(['episode', '--max_steps', '3', '--policy_url=u'], known), ['episode', '--max-steps', '3', '--policy-url=u']);
  // Parsed by commander as the hyphenated flags, into the override flags.
  const parsed = program.commands.find((c) => c.name() === 'train')!.exitOverride();
  parsed.parse(normalizeFlagSpellings(['--policy_url', 'http://h:8000/v1', '--loss_type', 'dr_grpo', '--num_generations', '8'], known), { from: 'user' });
  assert.deepEqual([parsed.opts().policyUrl, parsed.opts().lossType, parsed.opts().numGenerations], ['http://h:8000/v1', 'dr_grpo', '8']);
  // Shown once in --help: one line, no duplicate options.
  let help = '';
  parsed.configureOutput({ writeOut: (s) => (help += s) });
  parsed.outputHelp();
  assert.equal(help.split(ALSO_ACCEPTED).length, 2, help);
  assert.match(help, /also accepted: .*--policy_url, --loss_type, --num_generations/);
  assert.doesNotMatch(help, /^\s+--policy_url/m);
  assert.match(help, /^ {2}--policy-url <url>/m);
  assert.match(help, /^ {2}--loss-type <type>/m);
});

test('--policy-url: policy.baseUrl on an OpenAI-compatible server, adapters loaded there unless the file names a server', () => {
  const c = train({ policyUrl: 'http://gpu:8000/v1', lossType: 'dr_grpo' }, { policy: { backend: 'colocated', model: 'Qwen/Qwen3-VL-8B-Instruct' } });
  assert.deepEqual([c.policy.baseUrl, c.policy.backend, c.train.vllmBaseUrl, c.train.lossType], ['http://gpu:8000/v1', 'openai', 'http://gpu:8000/v1', 'dr_grpo']);
  const kept = train({ policyUrl: 'http://gpu:8000/v1' }, { train: { vllmBaseUrl: 'http://other:8000' } });
  assert.equal(kept.train.vllmBaseUrl, 'http://other:8000');
  const m = mcts({ policyUrl: 'http://gpu:8000/v1' });
  assert.deepEqual([m.policy.baseUrl, m.policy.backend, m.mcts.vllmBaseUrl], ['http://gpu:8000/v1', 'openai', 'http://gpu:8000/v1']);
});

test('halo mcts --episodes n: one search per task per iteration, never more than n searches', () => {
  const o = applyRunOverrides('mcts', { mcts: { tasks: ['a', 'b', 'c'] } }, { episodes: '20' }, ctx);
  assert.equal(halo(o).mcts.iterations, 6);
  assert.ok(
    o.notes.some((n) => /--episodes 20: 6 iterations × 3 searches = 18 searches \(2 left over/.test(n)),
    o.notes.join('\n'),
  );
  assert.equal(mcts({ episodes: '4' }).mcts.iterations, 4, 'the default task list has one task');
  assert.equal(mcts({ tasks: 'a,b', episodes: '7' }).mcts.iterations, 3);
  assert.throws(() => mcts({ episodes: '4', iterations: '2' }), /--episodes and --iterations: give one of them/);
  const repeated = applyRunOverrides('mcts', { mcts: { tasks: ['a', 'b'], searchesPerTask: 3 } }, { episodes: '20' }, ctx);
  assert.equal(halo(repeated).mcts.iterations, 3, 'searchesPerTask counts: 2 tasks × 3 searches per iteration');
  assert.throws(
    () => applyRunOverrides('mcts', { mcts: { tasks: ['a'], searchesPerTask: 4 } }, { episodes: '3' }, ctx),
    /3 searches cannot cover the 4 searches of one iteration \(4 searches per task/,
  );
});

test('a REAL task flag on the local tiny-random config is an error naming the REAL config', () => {
  const local = { policy: { backend: 'colocated', model: 'tiny-random' }, episode: { env: 'miniwob' } };
  const ctxFile = { ...ctx, file: 'configs/default.yaml' };
  assert.throws(
    () => applyRunOverrides('train', local, { domain: 'gomail' }, ctxFile),
    /^ConfigError: --domain gomail: configs\/default\.yaml is not a REAL config: it would train the local tiny-random test model .*--config configs\/grpo-real\.yaml/,
  );
  assert.throws(
    () => applyRunOverrides('train', local, { task: 'v2.gomail-1' }, ctx),
    /^ConfigError: --task v2\.gomail-1: the config is not a REAL config.*configs\/grpo-real\.yaml/,
  );
  assert.throws(() => applyRunOverrides('train', local, { env: 'real' }, ctx), /^ConfigError: --env real: .*configs\/grpo-real\.yaml/);
  assert.throws(() => applyRunOverrides('mcts', local, { domain: 'gomail' }, ctx), /--config configs\/mcts-real\.yaml/);
  // A REAL config, a served model, or a policy URL: the flags apply as before.
  assert.equal(train({ domain: 'gomail' }, { ...local, episode: { env: 'real' } }).episode.env, 'real');
  assert.equal(train({ domain: 'gomail' }, { policy: { backend: 'openai', model: 'Qwen/Qwen3-VL-8B-Instruct' } }).episode.env, 'real');
  assert.equal(train({ domain: 'gomail', policyUrl: 'http://gpu:8000/v1' }, local).policy.backend, 'openai');
  // MiniWoB++ tasks on the local config are what it is for.
  assert.equal(train({ tasks: 'click-button' }, local).episode.env, 'miniwob');
});

test('halo train refuses greedy sampling of N identical candidates, naming policy.temperature and train.numGenerations', () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-greedy-'));
  const file = join(dir, 'greedy.yaml');
  writeFileSync(file, 'policy:\n  temperature: 0\ntrain:\n  numGenerations: 4\n');
  assert.throws(() => runConfigFromFlags('train', file, '/nonexistent.yaml', {}), /^ConfigError: policy\.temperature 0 \(greedy\) with train\.numGenerations 4: .*identical/);
  assert.throws(
    () => runConfigFromFlags('train', undefined, '/nonexistent.yaml', { temperature: '0' }),
    /^ConfigError: --temperature: policy\.temperature 0 \(greedy\) with train\.numGenerations 8/,
  );
  assert.equal(runConfigFromFlags('train', file, '/nonexistent.yaml', { temperature: '0.7' }).cfg.policy.temperature, 0.7);
  // MCTS samples expansions at mcts.temperature: policy.temperature 0 is no problem there.
  assert.equal(runConfigFromFlags('mcts', file, '/nonexistent.yaml', {}).cfg.policy.temperature, 0);
});
