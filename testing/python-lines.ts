import { type ChildProcessWithoutNullStreams, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { minimalChildEnv } from '../env/child-env';

/**
 * A long-lived Python process of the stand-ins (the project's .venv Python), one JSON request per line on its stdin
 * and one JSON answer per line on its stdout, in order. Its imports (torch, transformers, xgrammar: seconds) are paid
 * once per Node process and script arguments; it keeps Node running only while an answer is awaited, and ends
 * when its stdin closes.
 */

const REPO_ROOT = resolve(__dirname, '..');

interface LineProcess {
  child: ChildProcessWithoutNullStreams;
  waiting: ((answer: Record<string, unknown>) => void)[];
}

const processes = new Map<string, LineProcess>();

/** Keeps Node running for the process only while an answer is awaited. */
function hold(child: ChildProcessWithoutNullStreams, on: boolean) {
  if (on) child.ref();
  else child.unref();
  for (const s of [child.stdin, child.stdout, child.stderr]) {
    const handle = s as unknown as { ref?: () => void; unref?: () => void };
    if (on) handle.ref?.();
    else handle.unref?.();
  }
}

function start(key: string, script: string, args: string[]): LineProcess {
  const python = join(REPO_ROOT, '.venv', 'bin', 'python');
  if (!existsSync(python)) throw new Error(`the stand-ins run ${script} with ${python}, which is missing (./launch.sh setup installs it)`);
  const child = spawn(python, [join(REPO_ROOT, script), ...args], { env: minimalChildEnv(), stdio: ['pipe', 'pipe', 'pipe'] });
  const p: LineProcess = { child, waiting: [] };
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => {
    stderr = (stderr + d.toString()).slice(-2000);
  });
  createInterface({ input: child.stdout }).on('line', (line) => {
    p.waiting.shift()?.(JSON.parse(line) as Record<string, unknown>);
    if (p.waiting.length === 0) hold(child, false);
  });
  const fail = (why: string) => {
    if (processes.get(key) === p) processes.delete(key);
    for (const answer of p.waiting.splice(0)) answer({ error: `${script} ${why}${stderr ? `: ${stderr.trim()}` : ''}` });
  };
  child.on('error', (err) => fail(`could not start: ${err.message}`));
  child.on('exit', (code, signal) => fail(`exited (${signal ?? code})`));
  hold(child, false);
  return p;
}

/** Sends one request to `script` (a path under the repository) started with `args`, and resolves with its answer. */
export function askPython(script: string, args: string[], request: unknown): Promise<Record<string, unknown>> {
  const key = JSON.stringify([script, args]);
  let p = processes.get(key);
  if (!p) {
    p = start(key, script, args);
    processes.set(key, p);
  }
  const proc = p;
  return new Promise((answer) => {
    proc.waiting.push(answer);
    hold(proc.child, true);
    proc.child.stdin.write(`${JSON.stringify(request)}\n`);
  });
}
