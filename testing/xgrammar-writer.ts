import type { VllmServer } from '../lib/model-io/grammar-blob';
import { askPython } from './python-lines';

/**
 * The vLLM stand-in's constrained answers, written by xgrammar itself (testing/xgrammar-writer.py): the JSON the
 * model means goes through a GrammarMatcher compiled with the call of the vLLM release played, so the separators
 * and anything else the grammar forces are xgrammar's, never the stand-in's guess.
 */

const SCRIPT = 'testing/xgrammar-writer.py';

export interface XgrammarWrite {
  schema: Record<string, unknown> | string;
  release: VllmServer;
  disableAnyWhitespace: boolean;
  /** The JSON the model means, tight (`,`/`:`, no whitespace): xgrammar adds what its grammar requires. */
  text: string;
}

/**
 * Resolves once the writer has imported xgrammar (seconds, once per Node process), so a stand-in that awaits it
 * answers its first constrained request as fast as any other.
 */
export async function xgrammarReady(): Promise<string> {
  const answer = await askPython(SCRIPT, [], { ping: true });
  if (typeof answer.xgrammar !== 'string') throw new Error(`the vLLM stand-in's xgrammar writer did not start: ${answer.error}`);
  return answer.xgrammar;
}

/** What xgrammar lets the model write: the text, or an Error saying what the grammar refused. */
export async function xgrammarWrite(req: XgrammarWrite): Promise<{ text: string; xgrammar: string }> {
  const answer = await askPython(SCRIPT, [], { schema: req.schema, release: req.release, disable_any_whitespace: req.disableAnyWhitespace, text: req.text });
  if (typeof answer.text !== 'string') throw new Error(`xgrammar (${req.release}'s call) refuses ${req.text.slice(0, 120)}: ${answer.error}`);
  return { text: answer.text, xgrammar: String(answer.xgrammar) };
}
