import type OpenAI from 'openai';
import type { BlobStore } from '../blob/store';
import type { PromptMessage } from '../lib/model-io/prompt';

function mimeOf(ref: string): string {
  const ext = ref.slice(ref.lastIndexOf('.') + 1);
  return ext === 'jpg' || ext === 'jpeg' ? 'image/jpeg' : ext === 'webp' ? 'image/webp' : 'image/png';
}

/**
 * Our prompt messages (text parts and image references) as OpenAI chat messages, the images read from the
 * blob store into data URLs. Shared by the policy and the critic so both send the same format.
 */
export async function toOpenAiMessages(blobs: BlobStore, messages: PromptMessage[]): Promise<OpenAI.Chat.Completions.ChatCompletionMessageParam[]> {
  const out: OpenAI.Chat.Completions.ChatCompletionMessageParam[] = [];
  for (const m of messages) {
    if (m.role === 'system') {
      out.push({ role: 'system', content: m.content.map((p) => (p.type === 'text' ? p.text : '')).join('\n') });
      continue;
    }
    const parts: OpenAI.Chat.Completions.ChatCompletionContentPart[] = [];
    for (const p of m.content) {
      if (p.type === 'text') parts.push({ type: 'text', text: p.text });
      else parts.push({ type: 'image_url', image_url: { url: `data:${mimeOf(p.ref)};base64,${(await blobs.get(p.ref)).toString('base64')}` } });
    }
    out.push({ role: 'user', content: parts });
  }
  return out;
}
