import '../host/load-env'; // first: .env fills in what the environment does not set
import { Command, Option } from 'commander';
import { WorkflowIdConflictPolicy } from '@temporalio/client';
import { existsSync, writeFileSync } from 'node:fs';
import { findMiniwobHtml } from '../env/miniwob-server';
import { assertMiniwobTask, listMiniwobTasks } from '../env/miniwob-tasks';
import { realTasksBySite, registrySnapshot } from '../env/real-tasks';
import { addOverrideOptions, flagDefaults, knownLongFlags, overrideFlagsOf, preflightTasks, runConfigFromFlags } from './run-flags';
import { completePolicyUrl, normalizeFlagSpellings } from './config-overrides';
import { join, resolve } from 'node:path';
import { loadConfigFile } from '../host/config-file';
import { ConfigError, parseConfig, type HaloConfig } from '../lib/config/config';
import type { EpisodeResult } from '../lib/episode/episode-types';
import { KIND, MODE, RUN_ID, TASK } from '../lib/episode/search-attributes';
import { REPO_ROOT } from './processes';
import { connectClient, down, downCompose, parseRoles, stackStatus, up } from './stack';
import { describeLatestMetrics, followTrain, runStatus, startOrAttachTrain, streamNote } from './train';
import { register as registerEval } from './commands/eval';
import { register as registerRuns } from './commands/runs';
import { register as registerView } from './commands/view';
import { register as registerReport } from './commands/report';
import { register as registerConfigDoc } from './commands/config-doc';
import { register as registerLearnerSchema } from './commands/learner-schema';
import { register as registerMcts } from './commands/mcts';
import { register as registerGc } from './commands/gc';
import { register as registerDoctor } from './commands/doctor';
import { register as registerExport } from './commands/export';
import { register as registerVerifyExploration } from './commands/verify-exploration';
import { register as registerComposeReplicas } from './commands/compose-replicas';
import { blobStoreFor } from '../blob/store';
import { episodeMaxSteps, singleEpisodeInput } from './episode-input';
import { reloadServedAdapters } from './served-adapters';
import { controlTimeoutMs, describeControl, sendRunControl } from './run-messages';
import { episodeProgressQuery } from '../workflows/episode';
import { EXIT, formatFailure, reportError, resultOf } from './failure';
import { tokenIdsNote } from './token-ids';
import { bestNote } from '../lib/serving/iteration-policy';
import { stackHealthLines } from './doctor-metrics';
import { withServedModel } from './served-model';

const DEFAULT_CONFIG = join(REPO_ROOT, 'configs', 'default.yaml');

function loadConfig(path: string | undefined): HaloConfig {
  if (path) return loadConfigFile(path);
  return existsSync(DEFAULT_CONFIG) ? loadConfigFile(DEFAULT_CONFIG) : parseConfig({});
}

const num = (name: string) => (v: string) => {
  const n = Number(v);
  if (!Number.isFinite(n)) throw new ConfigError(`--${name} must be a number, got ${JSON.stringify(v)}`);
  return n;
};

/** `--home` of `up`/`down`: this host's runs folder instead of the config's `stack.home`. */
function withHome(cfg: HaloConfig, home: string | undefined): HaloConfig {
  return home ? { ...cfg, stack: { ...cfg.stack, home: resolve(home) } } : cfg;
}

const program = new Command('halo')
  .description('HALO-Agent: durable online RL for a vision-language browser agent')
  .option('-c, --config <file>', 'config file (YAML)', undefined)
  .showHelpAfterError();

program
  .command('up')
  .description('start the local stack (Temporal dev server, control and browser workers) and wait until it is healthy')
  .option(
    '--role <role...>',
    'start only this part on this host (browser, control, learner; repeatable), against a Temporal server that runs elsewhere (TEMPORAL_ADDRESS…); no dev server is started',
  )
  .option('--home <dir>', 'the runs folder of this host (logs, pids, in-flight ledgers; blobs and checkpoints unless HALO_STORE names an object store); default stack.home')
  .option(
    '--upgrade',
    'restart a running control worker on the current workflow code, after replaying every open workflow against it (refused, naming the runs, when one would not replay)',
  )
  .option('--json', 'print the stack status as JSON')
  .action(async (opts: { json?: boolean; role?: string[]; home?: string; upgrade?: boolean }) => {
    const cfg = withHome(loadConfig(program.opts().config), opts.home);
    const roles = parseRoles(opts.role);
    const say = (m: string) => !opts.json && console.error(`halo: ${m}`);
    const st = await up(cfg, say, { roles, upgrade: opts.upgrade });
    const { client, connection } = await connectClient(cfg);
    try {
      if (!roles || roles.includes('control')) await reloadServedAdapters(client, say);
    } finally {
      await connection.close();
    }
    if (opts.json) console.log(JSON.stringify(st));
    else {
      console.log(`stack is up: Temporal ${st.address} (namespace ${st.namespace})${st.uiUrl ? `, UI ${st.uiUrl}` : ''}`);
      console.log(`logs: ${join(st.home, 'logs')}`);
    }
  });

program
  .command('down')
  .description('stop the local stack gracefully (workers first, then Temporal and the vLLM of ./launch.sh gpu) and a running docker compose stack; state stays on disk')
  .option('--role <role...>', 'stop only this part (browser, control, learner), as started by `up --role`; the Temporal server is left alone')
  .option('--home <dir>', 'the runs folder of this host (as given to `up --home`)')
  .action(async (opts: { role?: string[]; home?: string }) => {
    const cfg = withHome(loadConfig(program.opts().config), opts.home);
    const roles = parseRoles(opts.role);
    await down(cfg, (m) => console.error(`halo: ${m}`), { roles });
    if (!roles) downCompose(stackStatus(cfg).home, (m) => console.error(`halo: ${m}`));
    console.log('stack is down');
  });

program
  .command('episode')
  .description('run one durable episode and print its result')
  .addOption(new Option('--env <env>', 'environment').choices(['miniwob', 'real']))
  .option('--task <task>', 'task name, e.g. click-button')
  .option('--seed <n>', 'task seed', num('seed'))
  .option('--max-steps <n>', "step cap (default: the config's; --env real from a MiniWoB++ config: REAL's 25)", num('max-steps'))
  .option('--policy-url <url>', 'OpenAI-compatible base URL of the policy (vLLM), e.g. http://127.0.0.1:8000/v1')
  .option('--model <name>', 'model or LoRA adapter name served there')
  .option('--temperature <t>', 'sampling temperature', num('temperature'))
  .option('--id <workflowId>', 'workflow id (running it again with the same id attaches to the episode)')
  .option('--json', 'print the result as JSON only')
  .action(async (opts) => {
    const base = loadConfig(program.opts().config);
    const policyUrl = opts.policyUrl === undefined ? undefined : completePolicyUrl(opts.policyUrl);
    if (policyUrl?.completed) console.error(`halo: --policy-url ${opts.policyUrl}: completed to ${policyUrl.url} (vLLM's OpenAI API is under /v1)`);
    const cfg = parseConfig(
      {
        ...base,
        // A policy URL means an OpenAI-compatible server (vLLM), whatever backend the config names.
        policy: { ...base.policy, ...defined({ baseUrl: policyUrl?.url, model: opts.model, temperature: opts.temperature }), ...(opts.policyUrl ? { backend: 'openai' } : {}) },
        episode: { ...base.episode, ...defined({ env: opts.env, task: opts.task, seed: opts.seed, maxSteps: episodeMaxSteps(base, opts.env, opts.maxSteps) }) },
      },
      'command line',
    );
    const result = await runEpisode(cfg, opts.id, opts.json ? undefined : (m) => console.error(m));
    const home = stackStatus(cfg).home;
    const out = { ...result, trajectoryPath: blobStoreFor(home).locationOf(result.trajectoryRef) };
    const note = tokenIdsNote(result.tokenIdsMissing ?? 0, result.steps);
    if (note && !opts.json) console.error(`halo: ${note}`);
    if (opts.json) console.log(JSON.stringify(out));
    else {
      console.log(`${result.success ? 'success' : 'failure'}: reward ${result.reward}, ${result.steps} steps, action validity ${(result.actionValidity * 100).toFixed(0)}%`);
      console.log(`workflow ${result.workflowId}; trajectory ${out.trajectoryPath}`);
    }
  });

const trainCommand = program
  .command('train')
  .description('start a GRPO training run (or attach to it if the run id exists) and show its progress')
  .option('--run-id <id>', 'run id (default: train.runId of the config)')
  .option('--detach', 'return as soon as the run is started')
  .option('--dry-run', 'validate the config and flags, check the tasks (REAL: sites reachable, --task-registry matched) and print the run; start nothing')
  .option('--json', 'print the final result as JSON');
addOverrideOptions(trainCommand, 'train', () => ({ file: 'configs/default.yaml', values: flagDefaults('train', loadConfig(undefined)) }));
trainCommand.action(async (opts: { runId?: string; detach?: boolean; dryRun?: boolean; json?: boolean; taskRegistry?: string } & Record<string, unknown>) => {
  const fromFlags = runConfigFromFlags('train', program.opts().config, DEFAULT_CONFIG, opts);
  const { notes, pin } = fromFlags;
  const cfg = typeof opts.policyUrl === 'string' ? await withServedModel(fromFlags.cfg, { configGiven: program.opts().config !== undefined, notes }) : fromFlags.cfg;
  for (const n of notes) console.error(`halo: ${n}`);
  if (cfg.episode.env === 'real') await preflightTasks('real', [...cfg.train.tasks, ...cfg.train.heldOutTasks], pin, `GRPO run ${cfg.train.runId}`);
  else {
    assertTrainTasks(cfg);
    await preflightTasks(cfg.episode.env, [], pin, `GRPO run ${cfg.train.runId}`);
  }
  if (opts.dryRun) {
    const t = cfg.train;
    if (opts.json) console.log(JSON.stringify({ config: cfg, notes }));
    else {
      console.log(`run ${t.runId} (not started): ${cfg.episode.env} tasks ${t.tasks.join(', ')}${t.heldOutTasks.length ? `; held out ${t.heldOutTasks.join(', ')}` : ''}`);
      console.log(
        `${t.iterations} iterations × ${t.episodesPerIteration} episodes, N=${t.numGenerations} (${t.grouping} grouping), lr ${t.learningRate}, temperature ${cfg.policy.temperature}, policy ${cfg.policy.backend} ${cfg.policy.model}${t.seed !== undefined ? `, seed ${t.seed}` : ''}${pin ? `; tasks pinned to ${pin.file}` : ''}`,
      );
    }
    return;
  }
  const { client, connection } = await connectClient(cfg);
  try {
    const { handle, attached } = await startOrAttachTrain(client, cfg);
    console.error(`halo: ${attached ? 'attached to' : 'started'} run ${cfg.train.runId} (workflow id ${cfg.train.runId}, queue ${cfg.temporal.controlTaskQueue})`);
    if (attached && Object.keys(overrideFlagsOf(opts)).length) {
      console.error(`halo: run ${cfg.train.runId} already exists and keeps the config it started with; for these flags start a new run (--run-id NEW)`);
    }
    if (opts.detach) {
      if (opts.json) console.log(JSON.stringify({ runId: cfg.train.runId, attached }));
      return;
    }
    const result = await followTrain(handle, (line) => !opts.json && console.error(line));
    const home = stackStatus(cfg).home;
    const where = { metrics: join(home, cfg.train.runId, 'metrics.jsonl'), adapters: join(REPO_ROOT, 'checkpoints', cfg.train.runId), ui: stackStatus(cfg).uiUrl };
    if (opts.json) console.log(JSON.stringify({ ...result, ...where }));
    else {
      console.log(`run ${result.runId} finished: ${result.iterations} iterations, adapter v${result.adapterVersion}${result.stoppedEarly ? ' (stopped early)' : ''}`);
      const best = bestNote(result);
      if (best) console.log(best);
      console.log(
        `metrics:  ${where.metrics}\nadapters: ${where.adapters}${where.ui ? `\nUI:       ${where.ui}/namespaces/${stackStatus(cfg).namespace}/workflows/${result.runId}` : ''}`,
      );
    }
  } finally {
    await connection.close();
  }
});

program
  .command('status')
  .description("a run's state and its latest metrics; for a run that failed, the failure (child workflow, activity, error type, message, fix)")
  .argument('<run>', 'run id')
  .option('--json', 'print JSON')
  .action(async (run: string, opts: { json?: boolean }) => {
    const cfg = loadConfig(program.opts().config);
    const { client, connection } = await connectClient(cfg);
    try {
      const st = await runStatus(client, run, stackStatus(cfg).home);
      if (opts.json) console.log(JSON.stringify(st));
      else {
        console.log(
          `run ${run}: ${st.status}${st.progress ? ` · iteration ${st.progress.iteration}/${st.progress.iterations} · ${st.progress.phase}${st.progress.paused ? ' (paused)' : ''} · adapter v${st.progress.adapterVersion}${streamNote(st.progress)}` : ''}`,
        );
        if (st.latest) console.log(describeLatestMetrics(st.latest));
        if (st.failure) console.log(`last failure: ${formatFailure(st.failure)}`);
        for (const line of await stackHealthLines(cfg, process.env)) console.log(line);
      }
    } finally {
      await connection.close();
    }
  });

for (const [name, help] of [
  ['pause', 'pause a run before its next iteration'],
  ['stop', 'stop a run gracefully: the current iteration finishes and its adapter is kept'],
] as const) {
  program
    .command(name)
    .description(`${help}; prints the run's status once it took the change (a Workflow Update)`)
    .argument('<run>', 'run id')
    .action(async (run: string) => {
      const cfg = loadConfig(program.opts().config);
      const timeoutMs = controlTimeoutMs();
      const { client, connection } = await connectClient(cfg);
      try {
        console.log(describeControl(run, name, await sendRunControl(connection, client.workflow.getHandle(run), name, timeoutMs), timeoutMs));
      } finally {
        await connection.close();
      }
    });
}

const tasks = program
  .command('tasks')
  .description('list the tasks of an environment (REAL v2 from the installed agisdk, MiniWoB++ from the installed miniwob)')
  .addOption(new Option('--env <env>', 'environment').choices(['real', 'miniwob']).default('real'))
  .option('--json', 'print JSON')
  .action((opts: { env: 'real' | 'miniwob'; json?: boolean }) => {
    if (opts.env === 'miniwob') {
      const names = listMiniwobTasks(findMiniwobHtml());
      if (opts.json) console.log(JSON.stringify(names));
      else console.log(`${names.length} MiniWoB++ tasks\n${names.join('\n')}`);
      return;
    }
    const bySite = realTasksBySite();
    if (opts.json) {
      console.log(JSON.stringify(registrySnapshot()));
      return;
    }
    const total = Object.values(bySite).reduce((n, t) => n + t.length, 0);
    console.log(`${total} REAL v2 tasks in ${Object.keys(bySite).length} sites`);
    for (const [site, list] of Object.entries(bySite).sort(([a], [b]) => a.localeCompare(b))) {
      console.log(`\n${site} (${list.length})`);
      for (const t of list) {
        console.log(`  ${t.id.padEnd(16)} ${t.scorable ? '' : '[unscorable: ' + (t.unscorableReason ?? 'empty eval script') + '] '}${clipLine(t.goal, 100)}`);
        for (const c of t.caveats) console.log(`  ${''.padEnd(16)} [caveat: ${c}]`);
      }
    }
  });

tasks
  .command('snapshot')
  .description('write the REAL v2 registry (id, goal, site, start URL, eval script and its sha256) so a run can pin what it trained on')
  .requiredOption('--out <file>', 'output JSON file')
  .action((opts: { out: string }) => {
    const snap = registrySnapshot();
    writeFileSync(opts.out, JSON.stringify(snap, null, 2) + '\n');
    console.log(`wrote ${snap.tasks.length} tasks (agisdk ${snap.agisdk_version}) to ${opts.out}`);
  });

function clipLine(s: string, n: number): string {
  const one = s.replace(/\s+/g, ' ');
  return one.length <= n ? one : one.slice(0, n - 1) + '…';
}

/** Every MiniWoB++ task the run will use exists: checked before anything starts (REAL: preflightTasks). */
function assertTrainTasks(cfg: HaloConfig): void {
  const names = [...cfg.train.tasks, ...cfg.train.heldOutTasks];
  try {
    const known = listMiniwobTasks(findMiniwobHtml());
    for (const name of names) assertMiniwobTask(name, known);
  } catch (err) {
    throw new ConfigError(`train.tasks / train.heldOutTasks: ${(err as Error).message}`);
  }
}

function defined<T extends Record<string, unknown>>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}

export async function runEpisode(cfg: HaloConfig, workflowId: string | undefined, progress?: (m: string) => void): Promise<EpisodeResult> {
  const { client, connection } = await connectClient(cfg);
  try {
    const e = cfg.episode;
    const id = workflowId ?? `episode-${e.env}-${e.task}-s${e.seed}-${Date.now().toString(36)}`;
    const input = singleEpisodeInput(cfg, id);
    const handle = await client.workflow.start('episode', {
      taskQueue: cfg.temporal.controlTaskQueue,
      workflowId: id,
      args: [input],
      workflowIdConflictPolicy: WorkflowIdConflictPolicy.USE_EXISTING,
      staticSummary: `${input.task.env}/${input.task.task} seed ${input.task.seed} · ${cfg.policy.model}`,
      typedSearchAttributes: [
        { key: KIND, value: 'episode' },
        { key: TASK, value: `${input.task.env}/${input.task.task}` },
        { key: RUN_ID, value: id },
        { key: MODE, value: 'policy' },
      ],
    });
    progress?.(`episode ${id} started; watch it at the Temporal UI (workflow id ${id})`);
    let shown = 0;
    const timer = progress
      ? setInterval(async () => {
          try {
            const p = await handle.query(episodeProgressQuery);
            for (; shown < p.steps.length; shown++) {
              const s = p.steps[shown];
              progress(`  step ${s.step}: ${s.completion.action.type} → reward ${s.reward}`);
            }
          } catch {
            /* no worker answered the query yet */
          }
        }, 1000)
      : undefined;
    try {
      return await resultOf<EpisodeResult>(handle);
    } finally {
      if (timer) clearInterval(timer);
    }
  } finally {
    await connection.close();
  }
}

registerEval(program, { loadConfig });
registerRuns(program, { loadConfig });
for (const register of [
  registerView,
  registerReport,
  registerConfigDoc,
  registerLearnerSchema,
  registerMcts,
  registerGc,
  registerDoctor,
  registerExport,
  registerVerifyExploration,
  registerComposeReplicas,
])
  register(program, { loadConfig });

program.addHelpText(
  'after',
  `\nExit codes: ${EXIT.ok} done; ${EXIT.runtime} a runtime failure (a server down, a browser lost, a workflow that failed while running);\n` +
    `${EXIT.config} a configuration error (a bad flag or config field, or a workflow that failed non-retryably because of its config:\n` +
    'an unknown model or adapter, a server without the token ids a training run needs). A failed workflow is printed with the\n' +
    'child workflow and activity that failed, the error type, its message and the fix it names (--json: an "error" object).',
);

// The seeds' spellings: --num_generations, --policy_url, --loss_type, … are the hyphenated flags.
program.parseAsync(normalizeFlagSpellings(process.argv, knownLongFlags(program))).catch((err: unknown) => {
  process.exit(reportError(err, process.argv.includes('--json')));
});
