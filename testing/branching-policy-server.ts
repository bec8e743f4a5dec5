import { chatCompletion, startChatServer } from './chat-server';
import { promptOf, scriptedAnswer, toolCall, vllmTokenFields } from './fake-policy-server';

/**
 * An OpenAI-compatible "policy" that branches: for `n` choices, choice 0 is the fake policy server's scripted
 * answer (solves click-button / enter-text), choices 1..n-1 are left clicks at pseudo-random points of the
 * MiniWoB++ task area (160×210 px at the top left of a 1280×720 page: grid x 0–125, y 0–290), different per
 * request, so K samples are K different actions: some do nothing, some press the wrong thing.
 */
export async function startBranchingPolicyServer(): Promise<{ url: string; requests: number; close(): Promise<void> }> {
  let requests = 0;
  const server = await startChatServer('scripted', (body) => {
    const { goal, tree, previous } = promptOf(body);
    const index = requests++;
    const n = Math.max(1, Number(body.n ?? 1));
    const choices = Array.from({ length: n }, (_, i) => {
      let content = scriptedAnswer(goal, tree, previous);
      if (i > 0) {
        const h = Math.imul(index * 31 + i, 2654435761) >>> 0;
        const x = 5 + (h % 120);
        const y = 40 + ((h >>> 8) % 250);
        content = toolCall({ action: 'left_click', coordinate: [x, y] });
      }
      // The sampled tokens when asked, as vLLM gives them: a client that asked for ids and got none fails.
      return { index: i, finish_reason: 'stop', message: { role: 'assistant', content }, ...vllmTokenFields(content, 'stop', body) };
    });
    return chatCompletion(`chatcmpl-branch-${index}`, body.model, choices);
  });
  return {
    url: server.url,
    get requests() {
      return requests;
    },
    close: server.close,
  };
}
