import { readFileSync } from 'node:fs';

/**
 * The ids the vLLM stand-in writes for text: one token per byte, then the end-of-turn token. By default a made-up
 * vocabulary (`FAKE_BYTE_OFFSET + byte`, `<|im_end|>` = `FAKE_EOS_ID`); with a Hugging Face byte-level BPE
 * `tokenizer.json` (`byteLevelVocab`) the model's own single-byte tokens, so the ids are a tokenisation the model's
 * tokenizer (and xgrammar's matcher built from it) accepts: BPE merges are one way to tokenise, not the only one.
 */
export interface FakeVocab {
  /** Id of each byte value, indexed by the byte. */
  byteIds: number[];
  /** `<|im_end|>`: ends a turn (vLLM's `token_ids` include it when the answer stopped by itself). */
  eos: number;
  /** `<|im_start|>` and an image's marker, for the prompt's ids. */
  imStart: number;
  image: number;
  /** Byte of each byte id: the inverse of `byteIds`. */
  byteOf: Map<number, number>;
}

/** The made-up vocabulary's byte ids start here; they stay below 272, inside the tiny learner model's 400 ids. */
export const FAKE_BYTE_OFFSET = 16;
export const FAKE_EOS_ID = 2;

function vocab(byteIds: number[], eos: number, imStart: number, image: number): FakeVocab {
  return { byteIds, eos, imStart, image, byteOf: new Map(byteIds.map((id, b) => [id, b])) };
}

export const DEFAULT_VOCAB: FakeVocab = vocab(
  Array.from({ length: 256 }, (_, b) => FAKE_BYTE_OFFSET + b),
  FAKE_EOS_ID,
  3,
  4,
);

/**
 * GPT-2's byte-level alphabet (`bytes_to_unicode`): printable bytes stand for themselves, the others (controls,
 * space, DEL, NBSP, soft hyphen …) for code points from 256 up, in byte order. Byte-level BPE vocabularies spell
 * tokens in it.
 */
export function byteLevelAlphabet(): string[] {
  const printable = (b: number) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  let next = 256;
  return Array.from({ length: 256 }, (_, b) => String.fromCodePoint(printable(b) ? b : next++));
}

/** The byte-level vocabulary of a Hugging Face `tokenizer.json` (a BPE model with a ByteLevel pre-tokenizer). */
export function byteLevelVocab(tokenizerJson: string): FakeVocab {
  let tok: { model?: { type?: string; vocab?: Record<string, number> }; added_tokens?: { id: number; content: string }[] };
  try {
    tok = JSON.parse(readFileSync(tokenizerJson, 'utf8'));
  } catch (e) {
    throw new Error(`tokenizer ${tokenizerJson}: cannot read it as JSON (${(e as Error).message})`);
  }
  const v = tok.model?.vocab;
  if (tok.model?.type !== 'BPE' || !v || typeof v !== 'object') throw new Error(`tokenizer ${tokenizerJson}: not a BPE tokenizer.json (model.type ${tok.model?.type})`);
  const alphabet = byteLevelAlphabet();
  const missing = alphabet.filter((ch) => typeof v[ch] !== 'number');
  if (missing.length)
    throw new Error(`tokenizer ${tokenizerJson}: not byte-level, ${missing.length} of 256 byte tokens are missing from model.vocab (first ${JSON.stringify(missing[0])})`);
  const added = (name: string) => {
    const id = (tok.added_tokens ?? []).find((t) => t.content === name)?.id;
    if (typeof id !== 'number') throw new Error(`tokenizer ${tokenizerJson}: no ${name} in added_tokens`);
    return id;
  };
  return vocab(
    alphabet.map((ch) => v[ch]),
    added('<|im_end|>'),
    added('<|im_start|>'),
    added('<|image_pad|>'),
  );
}

/** One id per UTF-8 byte of `text`. */
export function byteIds(v: FakeVocab, text: string | Uint8Array): number[] {
  return [...(typeof text === 'string' ? Buffer.from(text, 'utf8') : text)].map((b) => v.byteIds[b]);
}

/** The ids of an answer: its bytes, then the end-of-turn token when it ended by itself (finish_reason `stop`). */
export function answerIds(v: FakeVocab, text: string, finishReason: string): number[] {
  const ids = byteIds(v, text);
  return finishReason === 'stop' ? [...ids, v.eos] : ids;
}

/** What vLLM's log-prob entry says a token is: its byte as a character, empty for the end of turn. */
export function tokenText(v: FakeVocab, id: number): string {
  const b = v.byteOf.get(id);
  return b === undefined ? '' : String.fromCharCode(b);
}
