import { chatCompletion, startChatServer, type ChatRequest, type JsonReply } from './chat-server';
import { ACTIONS_TAKEN_HEADER, CANDIDATES_HEADER } from '../lib/search/critic';

/**
 * A local stand-in for an OpenAI-compatible server playing the critic. It reads the candidate list that
 * lib/search/critic.ts's prompt builder wrote and answers:
 * - `prefer`: `{"ranking": [...], "value": v}` with the candidates whose text contains `substring` first
 *   (in index order), then the others (in index order); `value` defaults to 0.8; an outcome prompt (an ended
 *   episode to judge, lib/search/critic.ts `buildOutcomePrompt`) gets `{"value": outcomeValue}` (default `value`);
 * - `raw`: exactly `text` (to feed the parser any answer);
 * - `garbage`: prose with no JSON in it;
 * - `status`: an HTTP error with the given status.
 */
export type FakeCriticMode =
  | { kind: 'prefer'; substring: string; value?: number; outcomeValue?: number }
  | { kind: 'raw'; text: string; finishReason?: string }
  | { kind: 'garbage' }
  | { kind: 'status'; status: number };

export interface RecordedCriticRequest {
  model: string;
  n: number;
  temperature: number;
  maxTokens: number;
  /** The user message carries a base64 data-URL image part. */
  hasImage: boolean;
  /** The data URL's media type and the decoded image bytes (first image part), when there is one. */
  imageMime?: string;
  imageBytes?: Buffer;
  system: string;
  /** The user message's text parts. */
  text: string;
  goal: string;
  /** The candidate texts listed in the prompt, in order. */
  candidates: string[];
  /** rank: candidates to rank (critiqueCandidates); outcome: an ended episode to judge (judgeOutcome). */
  kind: 'rank' | 'outcome';
  /** Outcome prompts: the actions taken, as listed. */
  actions: string[];
}

export interface FakeCriticServer {
  url: string;
  requests: RecordedCriticRequest[];
  setMode(mode: FakeCriticMode): void;
  close(): Promise<void>;
}

/** The candidate texts listed after CANDIDATES_HEADER ("0. ...", "1. ...") up to the first blank line. */
export function parseCandidates(text: string): string[] {
  return listedAfter(text, CANDIDATES_HEADER);
}

/** The numbered lines ("0. ..." or "1. ...") after `header`, up to the first line that is not one. */
function listedAfter(text: string, header: string): string[] {
  const start = text.indexOf(`${header}\n`);
  if (start === -1) return [];
  const out: string[] = [];
  for (const line of text.slice(start + header.length + 1).split('\n')) {
    const m = /^(\d+)\. (.*)$/.exec(line);
    if (!m) break;
    out.push(m[2]);
  }
  return out;
}

/** The `prefer` mode's ranking: matching candidates first, each group in index order. */
export function preferRanking(candidates: string[], substring: string): number[] {
  const idx = candidates.map((_, i) => i);
  return [...idx.filter((i) => candidates[i].includes(substring)), ...idx.filter((i) => !candidates[i].includes(substring))];
}

export async function startFakeCriticServer(initial: FakeCriticMode = { kind: 'garbage' }): Promise<FakeCriticServer> {
  let mode = initial;
  const requests: RecordedCriticRequest[] = [];
  const answer = (body: ChatRequest): JsonReply => {
    const messages = Array.isArray(body.messages) ? body.messages : [];
    const sys = messages.find((m) => m.role === 'system');
    const userContent = messages.find((m) => m.role === 'user')?.content;
    const parts = Array.isArray(userContent) ? userContent : [];
    const text = parts
      .filter((p) => p.type === 'text')
      .map((p) => p.text)
      .join('\n');
    const image = parts.find((p) => p.type === 'image_url');
    const dataUrl = /^data:(image\/[a-z]+);base64,(.*)$/s.exec(image?.image_url?.url ?? '');
    const candidates = parseCandidates(text);
    const outcome = text.includes(`\n${ACTIONS_TAKEN_HEADER}\n`);
    const index = requests.length;
    requests.push({
      model: body.model,
      n: body.n ?? 1,
      temperature: body.temperature,
      maxTokens: body.max_tokens,
      hasImage: dataUrl !== null,
      ...(dataUrl ? { imageMime: dataUrl[1], imageBytes: Buffer.from(dataUrl[2], 'base64') } : {}),
      system: typeof sys?.content === 'string' ? sys.content : '',
      text,
      goal: /^Goal: (.*)$/m.exec(text)?.[1] ?? '',
      candidates,
      kind: outcome ? 'outcome' : 'rank',
      actions: outcome ? listedAfter(text, ACTIONS_TAKEN_HEADER) : [],
    });
    if (mode.kind === 'status') return { status: mode.status, body: { error: { message: `fake critic says ${mode.status}`, type: 'Error' } } };
    let content: string;
    let finishReason = 'stop';
    if (mode.kind === 'prefer') {
      content = outcome
        ? JSON.stringify({ value: mode.outcomeValue ?? mode.value ?? 0.8 })
        : JSON.stringify({ ranking: preferRanking(candidates, mode.substring), value: mode.value ?? 0.8 });
    } else if (mode.kind === 'raw') {
      content = mode.text;
      finishReason = mode.finishReason ?? 'stop';
    } else {
      content = 'The page looks nice. I would probably click something, but it is hard to say which one.';
    }
    return chatCompletion(`chatcmpl-fake-critic-${index}`, body.model, [{ index: 0, finish_reason: finishReason, message: { role: 'assistant', content } }]);
  };
  const server = await startChatServer('fake-critic', answer);
  return { url: server.url, requests, setMode: (m) => (mode = m), close: server.close };
}
