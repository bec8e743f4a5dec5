import { spawnSync } from 'node:child_process';
import type { Command } from 'commander';
import type { HaloConfig } from '../../lib/config';
import { learnerCommand } from '../processes';

/**
 * `halo gc`: adapter retention for one run's checkpoints, by the learner's own rules
 * (workers/learner/halo_learner/retention.py): the last K versions whole, older ones without optimiser state,
 * with --delete older ones removed unless they are milestones (every --keep-every) or named with --need.
 */
export function register(program: Command, _ctx: { loadConfig: (path?: string) => HaloConfig }): void {
  program
    .command('gc')
    .description("prune a run's adapter versions (optimiser state of old versions; with --delete, old versions)")
    .requiredOption('--run <id>', 'run id (checkpoints/<id>/v<N>)')
    .option('--keep-last <k>', 'versions kept whole', '3')
    .option('--keep-every <n>', 'with --delete: keep every n-th version (weights only)', '10')
    .option('--need <version...>', 'versions never touched (the running run, an evaluation, a served adapter)')
    .option('--delete', 'delete old versions, not only their optimiser state')
    .option('--dry-run', 'print what would go, change nothing')
    .action((opts: { run: string; keepLast: string; keepEvery: string; need?: string[]; delete?: boolean; dryRun?: boolean }) => {
      const { command, env } = learnerCommand();
      const args = ['-m', 'halo_learner.retention', '--run', opts.run, '--keep-last', opts.keepLast, '--keep-every', opts.keepEvery];
      for (const v of opts.need ?? []) args.push('--need', v);
      if (opts.delete) args.push('--delete');
      if (opts.dryRun) args.push('--dry-run');
      const r = spawnSync(command, args, { env, stdio: 'inherit' });
      if (r.error) throw r.error;
      if (r.status !== 0) process.exitCode = r.status ?? 1;
    });
}
