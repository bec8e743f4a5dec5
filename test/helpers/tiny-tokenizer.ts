import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';

/**
 * The `tokenizer.json` of the tiny model a test stack's learner built under `<home>/models` on its first start: the
 * vLLM stand-in answers in its ids, so the learner's tokenizer and grammar check take them as sampled.
 */
export function tinyTokenizer(home: string): string {
  const models = join(home, 'models');
  const tiny = existsSync(models) ? readdirSync(models).find((d) => d.startsWith('tiny-random-')) : undefined;
  if (!tiny) throw new Error(`the learner wrote no tiny model under ${models}`);
  return join(models, tiny, 'tokenizer.json');
}
