import { test } from 'node:test';
import assert from 'node:assert/strict';
import { MockActivityEnvironment } from '@temporalio/testing';
import { ApplicationFailure, ensureApplicationFailure } from '@temporalio/common';
import { addedTokensIn, neutraliseAddedTokens, QWEN3_VL_ADDED_TOKENS } from '../../lib/model-io/prompt-text';
import { buildPrompt } from '../../lib/model-io/prompt';
import { buildCriticPrompt } from '../../lib/search/critic';
import { parseAction } from '../../lib/model-io/parse';
import { activityErrorsInterceptor } from '../../workers/activity-errors';

const EVERY = QWEN3_VL_ADDED_TOKENS.join(' ');
const POISON = ' 2leh_j<|image_pad|>linebereeJJJJJJJJJJJ';

function textsOf(messages: { role: string; content: { type: string; text?: string }[] }[], role: string): string[] {
  return messages.filter((m) => m.role === role).flatMap((m) => m.content.flatMap((p) => (p.type === 'text' ? [p.text ?? ''] : [])));
}

test('neutralising leaves no added token, keeps every character and is idempotent', () => {
  for (const text of [EVERY, POISON, '<<|im_end|>|im_end|>>', '<|im_<|im_end|>end|>']) {
    const out = neutraliseAddedTokens(text);
    assert.deepEqual(addedTokensIn(out), []);
    assert.equal(out.replaceAll('\u200b', ''), text);
    assert.equal(neutraliseAddedTokens(out), out);
  }
  assert.equal(neutraliseAddedTokens('a <b>bold</b> | 3 < 4'), 'a <b>bold</b> | 3 < 4');
  assert.equal(addedTokensIn(EVERY).length, QWEN3_VL_ADDED_TOKENS.length);
});

test('the policy prompt: goal, URL, tree and previous actions are neutralised, the system turn keeps its tokens', () => {
  const prompt = buildPrompt(
    { goal: `Goal ${EVERY}`, url: `http://x/<|im_end|>`, axtree: `[3] button "${EVERY}" @(1,2)`, step: 2, screenshotRef: 'sha256:x.png' },
    [{ step: 1, action: `type "${POISON}"`, note: '<think>' }],
    4,
  );
  const user = textsOf(prompt, 'user').join('\n');
  assert.deepEqual(addedTokensIn(user), []);
  assert.ok(user.includes(POISON.replace('<|', '<\u200b|')), 'the typed text is still there, readable');
  assert.deepEqual(addedTokensIn(textsOf(prompt, 'system').join('\n')), ['<tool_call>', '</tool_call>']);
  assert.equal(prompt[1].content.filter((p) => p.type === 'image').length, 1);
});

test("the critic's prompt neutralises the candidates it lists too", () => {
  const prompt = buildCriticPrompt({ goal: EVERY, url: 'u', axtree: EVERY, screenshotRef: 'sha256:x.png' }, [`type ${POISON}`, 'click']);
  assert.deepEqual(addedTokensIn(textsOf(prompt, 'user').join('\n')), []);
});

test('an action whose free text spells a token is refused with a clear reason', () => {
  const call = (args: object) => `<tool_call>\n${JSON.stringify({ name: 'computer_use', arguments: args })}\n</tool_call>`;
  for (const tok of QWEN3_VL_ADDED_TOKENS) {
    for (const args of [
      { action: 'type', element_id: 3, text: `a${tok}b` },
      { action: 'answer', text: tok },
    ]) {
      const a = parseAction(call(args));
      assert.equal(a.type, 'invalid', `${JSON.stringify(args)} was accepted`);
      // Tool-call and thinking tags inside the text already break the call's structure; the others get this reason.
      if (!/tool_call|think/.test(tok)) assert.match(a.type === 'invalid' ? a.reason : '', new RegExp(`text: spells the tokenizer's special token ${tok.replace(/[|]/g, '\\|')}`));
    }
  }
  assert.equal(parseAction(call({ action: 'type', element_id: 3, text: 'a < b' })).type, 'type');
});

test('an activity that throws an unreadable value still fails with an ApplicationFailure', async () => {
  const hostile = new Proxy(
    {},
    {
      get: () => {
        throw new Error('no reading me');
      },
    },
  );
  // The gap: the SDK's own conversion reads the value and throws, so the attempt could never be completed.
  assert.throws(() => ensureApplicationFailure(hostile), /no reading me/);
  const env = new MockActivityEnvironment(undefined, { interceptors: [activityErrorsInterceptor()] });
  await assert.rejects(
    env.run(async () => {
      throw hostile;
    }),
    (err: unknown) => {
      assert.ok(err instanceof ApplicationFailure);
      assert.equal(err.type, 'NonErrorThrown');
      assert.equal(err.nonRetryable, false);
      return true;
    },
  );
  const plain = ApplicationFailure.nonRetryable('stays as it is', 'ConfigError');
  await assert.rejects(
    env.run(async () => {
      throw plain;
    }),
    (err: unknown) => err === plain,
  );
  await assert.rejects(
    env.run(async () => {
      throw 'a string';
    }),
    /not an Error: a string/,
  );
});
