/**
 * Does a test file flake? Runs each named test file N times, one after another, each in a process of its own (so
 * each starts its own stack, as in the suite), and keeps every run's verdict, seconds and the lines it printed that
 * start with `seed ` or `base `, or name a `greedy held-out` result (the learning tests' per-seed curves and their
 * greedy comparisons). Runs add up across invocations: the same `--tag` continues the count in
 * `<out>/<tag>/runs.json`, so ten runs can be gathered over several sittings, and the table says when and on which
 * commit each ran.
 *
 *   node --import tsx bench/test-repeats.ts --files test/integration/learning.test.ts,… [--runs 10] [--tag learning-tests]
 *        [--out bench/test-repeats]
 *
 * Writes <out>/<tag>/{table.md, runs.json} after every run. Exit status: 0 done (whatever the runs gave), 1 bad
 * arguments.
 */
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ConfigError } from '../lib/config/config';
import { benchCommandLine, load, machine, printBenchHeader } from './bench-run';
import { keptLines, testRepeatsMarkdown, type TestRun } from './repeat-runs';
import { parseBenchCli } from './method-runs';

const USAGE = `usage: node --import tsx bench/test-repeats.ts --files A,B [options]

Runs each test file --runs times (rounds: every file once, then again), and writes <out>/<tag>/{table.md, runs.json}.

  --files LIST   comma-separated test files (node --test)
  --runs N       rounds to add to what <out>/<tag>/runs.json already holds (default 10)
  --tag TAG      names the output folder (default test-repeats)
  --out DIR      output folder (default bench/test-repeats)
  -h, --help     this text`;

function runFile(file: string): Promise<{ code: number | null; output: string; seconds: number }> {
  const t0 = Date.now();
  return new Promise((resolve) => {
    const child = spawn(process.execPath, ['--import', 'tsx', '--test', '--test-force-exit', '--test-reporter=spec', file], { stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (d: Buffer) => {
      output += d.toString();
      process.stdout.write(d);
    });
    child.stderr.on('data', (d: Buffer) => {
      output += d.toString();
      process.stderr.write(d);
    });
    child.on('close', (code) => resolve({ code, output, seconds: (Date.now() - t0) / 1000 }));
  });
}

async function main(): Promise<void> {
  const values = parseBenchCli(
    process.argv.slice(2),
    {
      files: { type: 'string' },
      runs: { type: 'string', default: '10' },
      tag: { type: 'string', default: 'test-repeats' },
      out: { type: 'string', default: 'bench/test-repeats' },
    },
    USAGE,
  );
  const files = String(values.files ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  if (!files.length) throw new ConfigError(`--files: at least one test file\n\n${USAGE}`);
  for (const f of files) if (!existsSync(f)) throw new ConfigError(`--files: ${f} does not exist`);
  const rounds = Number(values.runs);
  if (!Number.isInteger(rounds) || rounds < 1) throw new ConfigError(`--runs ${values.runs}: a whole number ≥ 1`);
  const dir = join(String(values.out), String(values.tag));
  mkdirSync(dir, { recursive: true });
  const jsonPath = join(dir, 'runs.json');
  const runs: TestRun[] = existsSync(jsonPath) ? JSON.parse(readFileSync(jsonPath, 'utf8')) : [];
  const commit = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).trim();
  const command = benchCommandLine('test-repeats');
  printBenchHeader('test-repeats');
  console.log(`${machine()}; ${runs.length} runs already in ${jsonPath}`);
  for (let round = 1; round <= rounds; round++) {
    for (const file of files) {
      console.log(`\n## round ${round} of ${rounds}: ${file}`);
      const startedAt = new Date().toISOString().slice(0, 16).replace('T', ' ');
      const { code, output, seconds } = await runFile(file);
      runs.push({ file, passed: code === 0, exitCode: code, seconds, startedAt, commit, loadAtEnd: load(), lines: keptLines(output) });
      writeFileSync(jsonPath, `${JSON.stringify(runs, null, 2)}\n`);
      writeFileSync(join(dir, 'table.md'), testRepeatsMarkdown(runs, command));
      console.log(`## ${file}: ${code === 0 ? 'passed' : `FAILED (exit ${code})`} in ${seconds.toFixed(0)} s`);
    }
  }
}

main().catch((err: unknown) => {
  console.error(err instanceof ConfigError ? `test-repeats: ${err.message}` : err);
  process.exit(1);
});
