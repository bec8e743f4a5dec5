import { chatCompletion, startChatServer, type ChatServer } from './chat-server';
import { promptOf, scriptedAnswer } from './fake-policy-server';

/**
 * An OpenAI-compatible server that is not vLLM (LM Studio, Ollama, a hosted endpoint): it answers chat completions
 * with the scripted model's text and ignores vLLM's token fields, so no answer carries token ids. A request naming
 * another model than `model` gets vLLM's and OpenAI's 404 ("The model `X` does not exist.").
 */
export interface PlainChatServer extends ChatServer {
  /** Requests that asked for token ids (vLLM's `return_token_ids`), which this server never gives. */
  askedForTokenIds: number;
  requests: number;
}

export async function startPlainChatServer(model = 'plain-model'): Promise<PlainChatServer> {
  const state = { askedForTokenIds: 0, requests: 0 };
  const server = await startChatServer(model, (body) => {
    state.requests++;
    if (body.return_token_ids === true) state.askedForTokenIds++;
    if (body.model !== model) {
      return { status: 404, body: { error: { message: `The model \`${body.model}\` does not exist.`, type: 'NotFoundError', code: 404 } } };
    }
    const { goal, tree, previous } = promptOf(body);
    const n = body.n ?? 1;
    const text = scriptedAnswer(goal, tree, previous);
    const choices = Array.from({ length: n }, (_, index) => ({ index, message: { role: 'assistant', content: text }, finish_reason: 'stop', logprobs: null }));
    return chatCompletion(`plain-${state.requests}`, model, choices);
  });
  return {
    ...server,
    get askedForTokenIds() {
      return state.askedForTokenIds;
    },
    get requests() {
      return state.requests;
    },
  };
}
