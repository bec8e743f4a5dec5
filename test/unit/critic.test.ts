import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  ACTIONS_TAKEN_HEADER,
  buildOutcomePrompt,
  outcomeSystemPrompt,
  parseOutcomeAnswer,
  buildCriticPrompt,
  CANDIDATES_HEADER,
  criticSystemPrompt,
  MAX_CRITIC_OUTPUT_CHARS,
  NEUTRAL_VALUE,
  parseCriticAnswer,
  rankToPriors,
} from '../../lib/search/critic';
import { describeAction } from '../../lib/model-io/actions';
import { parseCandidates, preferRanking } from '../../testing/fake-critic-server';

const screenshotRef = 'sha256:' + 'a'.repeat(64) + '.png';
const obs = { goal: 'Click on the "OK" button.', url: 'http://x/miniwob/click-button.html', axtree: '[1] button "OK" @(100,200)', screenshotRef };
const candidates = [
  describeAction({ type: 'click_element', id: 1 }),
  describeAction({ type: 'click', x: 100, y: 200, button: 'left', count: 1 }),
  describeAction({ type: 'type', text: 'line one\nline two', id: 3 }),
];

test('the critic prompt: screenshot as an image reference, goal, tree, numbered candidates, the JSON format', () => {
  const [sys, user] = buildCriticPrompt({ ...obs, step: 4 }, candidates);
  assert.equal(sys.role, 'system');
  assert.equal(user.role, 'user');
  assert.deepEqual(user.content[0], { type: 'image', ref: screenshotRef });
  const sysText = (sys.content[0] as { text: string }).text;
  assert.equal(sysText, criticSystemPrompt());
  assert.match(sysText, /\{"ranking": \[2, 0, 1\], "value": 0\.6\}/);
  // The format example in the system prompt is itself a valid answer.
  assert.deepEqual(parseCriticAnswer('{"ranking": [2, 0, 1], "value": 0.6}', 3), { ranking: [2, 0, 1], value: 0.6, ok: true });
  const text = (user.content[1] as { text: string }).text;
  assert.match(text, /^Goal: Click on the "OK" button\.$/m);
  assert.match(text, /^URL: http:\/\/x\/miniwob\/click-button\.html$/m);
  assert.match(text, /^Step: 4$/m);
  assert.match(text, /\[1\] button "OK" @\(100,200\)/);
  assert.match(text, new RegExp(`^${CANDIDATES_HEADER}\\n0\\. click element \\[1\\]\\n1\\. click \\(100, 200\\)\\n2\\. type `, 'm'));
  assert.match(text, /Rank all 3 candidate actions \(numbers 0 to 2\)/);
  // Every candidate is one line, and the fake server reads them back exactly.
  assert.deepEqual(parseCandidates(text), candidates);
  const noStep = (buildCriticPrompt(obs, candidates)[1].content[1] as { text: string }).text;
  assert.doesNotMatch(noStep, /^Step:/m);
  // A candidate with raw newlines still takes one line.
  const odd = (buildCriticPrompt(obs, ['a\nb', 'c'])[1].content[1] as { text: string }).text;
  assert.deepEqual(parseCandidates(odd), ['a b', 'c']);
});

test('good critic answers are parsed', () => {
  const cases: [string, number, { ranking: number[]; value: number }][] = [
    ['{"ranking": [2, 0, 1], "value": 0.7}', 3, { ranking: [2, 0, 1], value: 0.7 }],
    ['```json\n{"ranking": [1, 0], "value": 0.25}\n```', 2, { ranking: [1, 0], value: 0.25 }],
    ['Candidate 1 clicks the button directly.\n{"ranking": [1, 2, 0], "value": 0.9}\nThat is my answer.', 3, { ranking: [1, 2, 0], value: 0.9 }],
    ['<think>{"ranking": [0, 1], "value": 0.1} hmm, no</think>\n{"ranking": [1, 0], "value": 1}', 2, { ranking: [1, 0], value: 1 }],
    ['reasoning without an opener</think>{"ranking":[0],"value":0}', 1, { ranking: [0], value: 0 }],
    ['{"reason": "the {button} is visible", "ranking": [0, 2, 1, 3], "value": 0.55, "extra": [1]}', 4, { ranking: [0, 2, 1, 3], value: 0.55 }],
    ['{"ranking": [0, 1, 2], "value": 1e-1}', 3, { ranking: [0, 1, 2], value: 0.1 }],
  ];
  for (const [text, k, expected] of cases) {
    assert.deepEqual(parseCriticAnswer(text, k), { ...expected, ok: true }, text);
  }
});

test('a partial ranking is completed with the missing indexes in increasing order', () => {
  const r = parseCriticAnswer('{"ranking": [3, 1], "value": 0.4}', 5);
  assert.deepEqual([r.ranking, r.value, r.ok], [[3, 1, 0, 2, 4], 0.4, true]);
  assert.match(r.reason ?? '', /partial ranking: 2 of 5/);
  assert.deepEqual(parseCriticAnswer('{"ranking": [2], "value": 0.4}', 3).ranking, [2, 0, 1]);
});

test('malformed critic answers give the neutral verdict with a reason', () => {
  const k = 3;
  const cases: [unknown, RegExp][] = [
    ['', /empty output/],
    ['   \n\t ', /empty output/],
    ['I think the second option is best, success is likely.', /no JSON object found/],
    ['{"ranking": [0, 1, 2], "value": ', /truncated JSON/],
    ['{ranking: [0, 1, 2], value: 0.5}', /invalid JSON/],
    ['[2, 0, 1]', /JSON array at top level/],
    ['null', /JSON null at top level/],
    ['0.7', /JSON number at top level/],
    ['{"value": 0.5}', /missing "ranking"/],
    ['{"ranking": [0, 1, 2]}', /missing "value"/],
    ['{"ranking": "2,0,1", "value": 0.5}', /ranking: must be an array \(got string\)/],
    ['{"ranking": {"0": 1}, "value": 0.5}', /ranking: must be an array \(got object\)/],
    ['{"ranking": [], "value": 0.5}', /ranking: is empty/],
    ['{"ranking": [0, 1, 3], "value": 0.5}', /ranking\[2\]: index 3 is out of range 0\.\.2/],
    ['{"ranking": [1, 2, 3], "value": 0.5}', /index 3 is out of range/], // 1-based
    ['{"ranking": [-1, 0, 1], "value": 0.5}', /index -1 is out of range/],
    ['{"ranking": [0, 1.5, 2], "value": 0.5}', /ranking\[1\]: must be an integer index \(got 1\.5\)/],
    ['{"ranking": ["2", "0", "1"], "value": 0.5}', /ranking\[0\]: must be an integer index \(got "2"\)/],
    ['{"ranking": [true, 0, 1], "value": 0.5}', /must be an integer index/],
    ['{"ranking": [0, 0, 1], "value": 0.5}', /index 0 appears twice/],
    ['{"ranking": [0, 1, 2, 0], "value": 0.5}', /has 4 entries for 3 candidates/],
    ['{"ranking": [0, 1, 2], "value": 1.5}', /value: must be between 0 and 1 \(got 1\.5\)/],
    ['{"ranking": [0, 1, 2], "value": -0.1}', /value: must be between 0 and 1/],
    ['{"ranking": [0, 1, 2], "value": 70}', /value: must be between 0 and 1 \(got 70\)/],
    ['{"ranking": [0, 1, 2], "value": 1e999}', /value: must be between 0 and 1 \(got Infinity\)/],
    ['{"ranking": [0, 1, 2], "value": "0.7"}', /value: must be a number \(got string\)/],
    ['{"ranking": [0, 1, 2], "value": null}', /value: must be a number \(got null\)/],
    ['<think>the best is {"ranking": [0, 1, 2], "value": 0.5}', /unterminated <think>/],
    ['x'.repeat(MAX_CRITIC_OUTPUT_CHARS + 1), /output too long/],
    ['{"ranking": [0, 1, 2], "value": 0.5' + ' '.repeat(MAX_CRITIC_OUTPUT_CHARS), /output too long/],
    [123, /expected a string, got number/],
    [undefined, /expected a string, got undefined/],
  ];
  assert.ok(cases.length >= 15);
  for (const [text, reason] of cases) {
    const r = parseCriticAnswer(text as string, k);
    assert.equal(r.ok, false, String(text).slice(0, 80));
    assert.deepEqual(r.ranking, [0, 1, 2], String(text).slice(0, 80));
    assert.equal(r.value, NEUTRAL_VALUE);
    assert.match(r.reason ?? '', reason, String(text).slice(0, 80));
    assert.ok((r.reason ?? '').length <= 200);
  }
});

test('the parser stays fast on adversarial input just under the length limit', () => {
  const inputs = ['{'.repeat(MAX_CRITIC_OUTPUT_CHARS), '{"a":'.repeat(3000), '<think>'.repeat(2000), '{}'.repeat(MAX_CRITIC_OUTPUT_CHARS / 2)];
  const t0 = performance.now();
  for (const text of inputs) assert.equal(parseCriticAnswer(text, 3).ok, false);
  assert.ok(performance.now() - t0 < 1000);
});

test('an invalid candidate count gives an empty neutral verdict', () => {
  assert.deepEqual(parseCriticAnswer('{"ranking": [0], "value": 0.5}', -1), { ranking: [], value: 0.5, ok: false, reason: 'invalid candidate count -1' });
  assert.equal(parseCriticAnswer('{"ranking": [0], "value": 0.5}', 1.5).ok, false);
});

test('rankToPriors: linear in rank, best 1 and worst 0, indexed by candidate', () => {
  // k = 3, ranking [2, 0, 1]: rank 0 → 1, rank 1 → 1 − 1/2 = 0.5, rank 2 → 0; by candidate: [0.5, 0, 1]
  assert.deepEqual(rankToPriors([2, 0, 1]), [0.5, 0, 1]);
  // k = 5, reversed: ranks 4..0 → 0, 0.25, 0.5, 0.75, 1
  assert.deepEqual(rankToPriors([4, 3, 2, 1, 0]), [0, 0.25, 0.5, 0.75, 1]);
  assert.deepEqual(rankToPriors([0]), [1]);
  assert.deepEqual(rankToPriors([]), []);
  assert.deepEqual(rankToPriors([1, 0]), [0, 1]);
  // Neutral verdict (identity ranking): priors decrease with the index.
  assert.deepEqual(rankToPriors(parseCriticAnswer('garbage', 3).ranking), [1, 0.5, 0]);
});

test('fake critic preference ranking', () => {
  assert.deepEqual(preferRanking(['click element [1]', 'type "x"', 'click element [2]', 'wait 1s'], 'click element'), [0, 2, 1, 3]);
  assert.deepEqual(preferRanking(['a', 'b'], 'zzz'), [0, 1]);
});

test('the outcome prompt: final screenshot, goal, tree and the numbered actions taken; no candidates', () => {
  const actions = [describeAction({ type: 'type', text: 'hello\nworld', id: 3 }), describeAction({ type: 'click_element', id: 1 })];
  const [sys, user] = buildOutcomePrompt(obs, actions);
  assert.equal((sys.content[0] as { text: string }).text, outcomeSystemPrompt());
  // The format example in the system prompt is itself a valid answer.
  assert.deepEqual(parseOutcomeAnswer('{"value": 0.9}'), { value: 0.9, ok: true });
  assert.deepEqual(user.content[0], { type: 'image', ref: screenshotRef });
  const text = (user.content[1] as { text: string }).text;
  assert.match(text, /^Goal: Click on the "OK" button\.$/m);
  assert.match(text, new RegExp(`^${ACTIONS_TAKEN_HEADER}\\n1\\. type "hello\\\\nworld" into \\[3\\]\\n2\\. click element \\[1\\]$`, 'm'));
  assert.doesNotMatch(text, new RegExp(CANDIDATES_HEADER));
  assert.deepEqual(parseCandidates(text), [], 'the fake critic does not mistake it for a ranking prompt');
  const none = (buildOutcomePrompt(obs, [])[1].content[1] as { text: string }).text;
  assert.match(none, new RegExp(`^${ACTIONS_TAKEN_HEADER}\\n\\(none\\)$`, 'm'));
});

test('outcome answers: a value in [0, 1] anywhere a critic answer may be; anything else is neutral with a reason', () => {
  for (const [text, value] of [
    ['{"value": 0.25}', 0.25],
    ['{"ranking": [], "value": 1}', 1],
    ['```json\n{"value": 0}\n```', 0],
    ['<think>the OK button was clicked</think>The goal was achieved: {"value": 0.95, "why": "clicked OK"}', 0.95],
  ] as const) {
    assert.deepEqual(parseOutcomeAnswer(text), { value, ok: true }, text);
  }
  for (const [text, reason] of [
    ['', /empty output/],
    ['Looks done to me.', /no JSON object found/],
    ['{"value": 1.5}', /value: must be between 0 and 1 \(got 1\.5\)/],
    ['{"value": "0.9"}', /value: must be a number \(got string\)/],
    ['{"ranking": [0]}', /missing "value"/],
    ['{"value": 0.9', /truncated JSON/],
    ['x'.repeat(MAX_CRITIC_OUTPUT_CHARS + 1), /output too long/],
    [42 as unknown as string, /expected a string, got number/],
  ] as const) {
    const v = parseOutcomeAnswer(text);
    assert.equal(v.ok, false, String(text).slice(0, 40));
    assert.equal(v.value, NEUTRAL_VALUE);
    assert.match(v.reason ?? '', reason);
  }
});
