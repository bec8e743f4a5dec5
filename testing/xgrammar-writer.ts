import { type ChildProcessWithoutNullStreams, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { minimalChildEnv } from '../env/child-env';
import type { VllmServer } from '../lib/grammar-blob';

/**
 * The vLLM stand-in's constrained answers, written by xgrammar itself (testing/xgrammar-writer.py, run by the
 * project's .venv Python): the JSON the model means goes through a GrammarMatcher compiled with the call of the vLLM
 * release played, so the separators and anything else the grammar forces are xgrammar's, never the stand-in's guess.
 * One process serves every stand-in of this Node process (importing xgrammar takes seconds); it is not waited for
 * at exit and ends when its stdin closes.
 */

const REPO_ROOT = resolve(__dirname, '..');
const SCRIPT = join(REPO_ROOT, 'testing', 'xgrammar-writer.py');

export interface XgrammarWrite {
  schema: Record<string, unknown> | string;
  release: VllmServer;
  disableAnyWhitespace: boolean;
  /** The JSON the model means, tight (`,`/`:`, no whitespace): xgrammar adds what its grammar requires. */
  text: string;
}

type Answer = { text: string; xgrammar: string } | { error: string };

let writer: { child: ChildProcessWithoutNullStreams; waiting: ((a: Answer) => void)[] } | undefined;

function start() {
  const python = join(REPO_ROOT, '.venv', 'bin', 'python');
  if (!existsSync(python)) {
    throw new Error(`the vLLM stand-in writes constrained answers through xgrammar, and ${python} is missing (./launch.sh setup installs it)`);
  }
  const child = spawn(python, [SCRIPT], { env: minimalChildEnv(), stdio: ['pipe', 'pipe', 'pipe'] });
  const w = { child, waiting: [] as ((a: Answer) => void)[] };
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => {
    stderr = (stderr + d.toString()).slice(-2000);
  });
  createInterface({ input: child.stdout }).on('line', (line) => {
    w.waiting.shift()?.(JSON.parse(line) as Answer);
    if (w.waiting.length === 0) hold(child, false);
  });
  const fail = (why: string) => {
    if (writer === w) writer = undefined;
    for (const resolveOne of w.waiting.splice(0)) resolveOne({ error: `${SCRIPT} ${why}${stderr ? `: ${stderr.trim()}` : ''}` });
  };
  child.on('error', (err) => fail(`could not start: ${err.message}`));
  child.on('exit', (code, signal) => fail(`exited (${signal ?? code})`));
  hold(child, false);
  return w;
}

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

function ask(request: unknown): Promise<Answer> {
  writer ??= start();
  const w = writer;
  return new Promise<Answer>((resolveOne) => {
    w.waiting.push(resolveOne);
    hold(w.child, true);
    w.child.stdin.write(`${JSON.stringify(request)}\n`);
  });
}

/**
 * Resolves once the writer has imported xgrammar (seconds, once per Node process), so a stand-in that awaits it
 * answers its first constrained request as fast as any other.
 */
export async function xgrammarReady(): Promise<string> {
  const answer = await ask({ ping: true });
  if ('error' in answer) throw new Error(`the vLLM stand-in's xgrammar writer did not start: ${answer.error}`);
  return (answer as { xgrammar: string }).xgrammar;
}

/** What xgrammar lets the model write: the text, or an Error saying what the grammar refused. */
export async function xgrammarWrite(req: XgrammarWrite): Promise<{ text: string; xgrammar: string }> {
  const answer = await ask({ schema: req.schema, release: req.release, disable_any_whitespace: req.disableAnyWhitespace, text: req.text });
  if ('error' in answer) throw new Error(`xgrammar (${req.release}'s call) refuses ${req.text.slice(0, 120)}: ${answer.error}`);
  return answer;
}
