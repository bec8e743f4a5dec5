/**
 * How repeatable each method is on one config: K training runs per method, each an ordinary run on the user's
 * stack (`npx halo up`) with its own periodic greedy held-out evaluations, then one table: in how many runs the
 * method reached the threshold, in how many it still held it at the last evaluation, and the browser sessions and
 * env steps it took to get there (median and range over the runs that did). bench/methods.ts compares methods by
 * one run each; greedy success on a few held-out seeds of one task moves in large steps from run to run, and a
 * claim that one method gets there sooner needs several.
 *
 *   node --import tsx bench/repeats.ts [--config configs/multistep.yaml] [--rows grpo-step,grpo-anchor]
 *        [--row-config ROW=FILE,…] [--runs 3] [--parallel 1] [--tag repeats] [--out bench/repeats]
 *
 * Run ids `<tag>-r<k>-<row>`, trained round by round (every row's first run, then every row's second, …), at
 * most --parallel at once. Every run is a workflow with a fixed id: the same command after a crash or restart
 * attaches to the runs it started and goes on; a finished run is only read. A run that failed stays in the
 * table as failed, with its reason.
 * Writes <out>/<tag>/{table.md, runs.json}; prints the command and the table.
 *
 * Exit status: 0 done, 1 bad arguments or config, 2 the stack does not answer (run `npx halo up`).
 */
import '../host/load-env'; // first: .env fills in what the environment does not set (HALO_CHECKPOINTS, TEMPORAL_ADDRESS, …)
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { join, relative, resolve } from 'node:path';
import { loadConfigFile } from '../host/config-file';
import { ConfigError } from '../lib/config/config';
import { SUCCESS_THRESHOLD, comparisonProblems, methodRow, type Method } from './methods-table';
import { repeatRun, repeatSummary, repeatsMarkdown, type RepeatsReport } from './repeat-runs';
import { benchCommandLine, printBenchHeader, printLoadAtEnd } from './bench-run';
import { StackDown, parseBenchCli, rowArgs, checkTasks, checkWorkers, connectOrExit, mapLimit, rowConfigNotes, rowPlans, runRow, type RowPlan } from './method-runs';

const USAGE = `usage: node --import tsx bench/repeats.ts [options]

Trains each method K times on the running stack (npx halo up) and writes <out>/<tag>/{table.md, runs.json}:
per method, how many runs reached the success threshold on the held-out seeds, how many held it at the last
evaluation, and the browser sessions and env steps to get there. The same command again attaches (after a crash
or restart); finished runs are only read.

  --config FILE   halo config with train (and, for mcts-dpo, mcts) sections, evaluating on held-out seeds
                  (train.evalEvery or evalEverySteps) (default configs/multistep.yaml)
  --rows LIST     comma-separated trained methods: grpo-episode, grpo-step, grpo-anchor, mcts-dpo
                  (default grpo-step,grpo-anchor)
  --row-config LIST  ROW=FILE,…: those rows train with that config file (same environment, policy, tasks and
                  held-out seeds), as in bench/methods.ts
  --runs K        runs per method (default 3)
  --parallel P    runs at once (default 1; two share a 2-core machine's CPU and each goes slower)
  --tag TAG       run ids <tag>-r<k>-<row> (default repeats)
  --out DIR       output folder (default bench/repeats)
  -h, --help      this text

Exit status: 0 done, 1 bad arguments or config, 2 the stack does not answer (run npx halo up).`;

interface Args {
  config: string;
  methods: Method[];
  rowConfigs: Map<Method, string>;
  runs: number;
  parallel: number;
  tag: string;
  out: string;
}

function count(flag: string, text: string, max: number): number {
  const n = Number(text);
  if (!Number.isInteger(n) || n < 1 || n > max) throw new ConfigError(`--${flag} ${JSON.stringify(text)}: a whole number from 1 to ${max}`);
  return n;
}

function parseCli(argv: string[]): Args {
  const values = parseBenchCli(
    argv,
    {
      config: { type: 'string', default: 'configs/multistep.yaml' },
      rows: { type: 'string', default: 'grpo-step,grpo-anchor' },
      'row-config': { type: 'string', default: '' },
      runs: { type: 'string', default: '3' },
      parallel: { type: 'string', default: '1' },
      tag: { type: 'string', default: 'repeats' },
      out: { type: 'string', default: 'bench/repeats' },
    },
    USAGE,
  );
  // The longest id made from the tag: <tag>-r99-grpo-episode, within a run id's 81 characters.
  const { tag, methods, rowConfigs } = rowArgs(values, 64);
  if (methods.includes('base')) throw new ConfigError('--rows: base trains nothing, so it has nothing to repeat (bench/methods.ts has its row)');
  return {
    config: values.config as string,
    methods,
    rowConfigs,
    runs: count('runs', values.runs as string, 99),
    parallel: count('parallel', values.parallel as string, 8),
    tag,
    out: values.out as string,
  };
}

const say = (line: string) => console.error(`repeats: ${line}`);

async function main(): Promise<void> {
  const args = parseCli(process.argv.slice(2));
  const configPath = resolve(args.config);
  if (!existsSync(configPath)) throw new ConfigError(`config ${args.config} does not exist: pass --config FILE, a halo config with a train section`);
  const cfg = loadConfigFile(configPath);
  const problems = comparisonProblems(cfg, args.methods);
  if (problems.length) throw new ConfigError(`config ${args.config} cannot compare the methods:\n${problems.map((p) => `  ${p}`).join('\n')}`);
  // Round by round, so an interrupted bench has as many runs of every method.
  const rounds: { k: number; plan: RowPlan }[] = [];
  for (let k = 1; k <= args.runs; k++) for (const plan of rowPlans(cfg, `${args.tag}-r${k}`, args.methods, args.rowConfigs)) rounds.push({ k, plan });
  await checkTasks(cfg);
  const outDir = resolve(args.out, args.tag);

  printBenchHeader('repeats');
  const { client, connection } = await connectOrExit(cfg);
  try {
    await checkWorkers(connection, cfg);
    mkdirSync(outDir, { recursive: true });
    say(
      `${rounds.length} runs (${args.runs} per method, ${args.parallel} at once): ${rounds.map((r) => r.plan.runId).join(', ')}. Interrupted? The same command attaches and goes on.`,
    );
    const outcomes = await mapLimit(rounds, args.parallel, ({ k, plan }) => runRow(client, plan, say, `${plan.method} r${k}`));
    const summaries = args.methods.map((method) => {
      const runs = outcomes
        .filter((o) => o.method === method)
        .map((o) => repeatRun(methodRow({ method, runId: o.runId!, metrics: o.metrics, ...(o.failed ? { failed: o.failed } : {}) })));
      return repeatSummary(method, runs, SUCCESS_THRESHOLD);
    });
    const notes = [...rowConfigNotes(args.rowConfigs, args.methods), ...outcomes.flatMap((o) => (o.note ? [o.note] : []))];
    const unevaluated = outcomes.filter((o) => !o.failed && !o.metrics.some((m) => m.eval || m.mcts?.eval_success_rate !== undefined));
    if (unevaluated.length) notes.push(`no held-out evaluation in ${unevaluated.map((o) => o.runId).join(', ')}: set train.evalEvery (or evalEverySteps) / mcts.evalEvery`);
    const report: RepeatsReport = {
      command: benchCommandLine('repeats'),
      threshold: SUCCESS_THRESHOLD,
      tasks: cfg.train.heldOutTasks,
      seeds: cfg.train.evalSeeds ?? [],
      summaries,
      notes,
    };
    const markdown = repeatsMarkdown(report);
    const files = { table: join(outDir, 'table.md'), runs: join(outDir, 'runs.json') };
    writeFileSync(files.table, markdown);
    writeFileSync(files.runs, JSON.stringify({ config: relative(process.cwd(), configPath), tag: args.tag, ...report }, null, 2) + '\n');
    console.log('');
    console.log(markdown);
    console.log(`written: ${Object.values(files).join(', ')}`);
    printLoadAtEnd();
  } finally {
    await connection.close();
  }
}

main().catch((err) => {
  if (err instanceof StackDown) {
    console.error(`repeats: ${err.message}`);
    process.exit(2);
  }
  console.error(err instanceof ConfigError ? `repeats: ${err.message}` : err);
  process.exit(1);
});
