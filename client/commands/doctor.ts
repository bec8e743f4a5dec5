import type { Command } from 'commander';
import type { HaloConfig } from '../../lib/config/config';
import { formatDoctor, runDoctor } from '../doctor';

export function register(program: Command, ctx: { loadConfig: (path?: string) => HaloConfig }): void {
  program
    .command('doctor')
    .description(
      'check that this machine is ready: Temporal (namespace, search attributes), workers, learner (device), Chromium, MiniWoB++, agisdk, REAL sites, vLLM (LoRA), GPU memory, disk; exits 1 when a check fails',
    )
    .option('--json', 'print the checks as JSON')
    .option('--timeout <s>', 'seconds each network probe may take', '5')
    .action(async (opts: { json?: boolean; timeout: string }) => {
      const timeoutS = Number(opts.timeout);
      if (!Number.isFinite(timeoutS) || timeoutS <= 0) throw new Error(`--timeout must be a positive number of seconds, got ${JSON.stringify(opts.timeout)}`);
      const cfg = ctx.loadConfig(program.opts().config);
      const report = await runDoctor(cfg, { timeoutS });
      console.log(opts.json ? JSON.stringify(report) : formatDoctor(report));
      process.exitCode = report.ok ? 0 : 1;
    });
}
