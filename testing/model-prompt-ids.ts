import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import type { ChatRequest } from './chat-server';
import { askPython } from './python-lines';

export const PROMPT_ENCODER = 'testing/prompt-encoder.py';

/** A chat request's prompt ids as vLLM would encode it with the model in `modelDir` (testing/prompt-encoder.py). */
export async function encodePrompt(modelDir: string, body: ChatRequest): Promise<number[]> {
  const answer = await askPython(PROMPT_ENCODER, [modelDir], { messages: body.messages });
  if (!Array.isArray(answer.ids)) throw new Error(`the stand-in could not encode the prompt with ${modelDir}'s processor: ${answer.error}`);
  return answer.ids as number[];
}

/**
 * `promptIds` for a stand-in whose runs are learnt by a test stack's learner: the prompt encoded by the tiny model
 * that learner built under `<home>/models`, found at the first request (the learner builds it when it starts). The
 * learner drops items whose prompt ids differ from its own encoding, as it must for a real server; a stand-in that
 * sent made-up prompt ids would have every item dropped.
 */
export function stackPromptIds(home: string): (body: ChatRequest) => Promise<number[]> {
  let modelDir: string | undefined;
  return (body) => {
    modelDir ??= tinyModelDir(home);
    return encodePrompt(modelDir, body);
  };
}

/** The folder of the tiny model a test stack's learner built under `<home>/models` when it started. */
export function tinyModelDir(home: string): string {
  const models = join(home, 'models');
  const tiny = existsSync(models) ? readdirSync(models).find((d) => d.startsWith('tiny-random')) : undefined;
  if (!tiny) throw new Error(`no tiny model under ${models} yet: the stack's learner builds it when it starts`);
  return join(models, tiny);
}
