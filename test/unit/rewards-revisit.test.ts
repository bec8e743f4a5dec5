import { test } from 'node:test';
import assert from 'node:assert/strict';
import { computeReward, defaultRewardWeights, initialRewardState, parseRewardWeights, summarizeBreakdown, type RewardInput, type RewardView } from '../../lib/rewards';

// The state-visitation penalty (general.revisit): the remedy for an agent that keeps to the same few states, off by
// default so the default curves stay as they are.

const page = (name: string): RewardView => ({ url: 'https://real-gomail.example.app/', axtree: `[1] heading "${name}" @(10,10)` });
const INBOX = page('Inbox');
const SENT = page('Sent');
const DRAFTS = page('Drafts');

const step = (before: RewardView, after: RewardView, actionKey: string, valid = true): RewardInput => ({
  site: null,
  valid,
  actionKey,
  before,
  after,
  taskSuccess: null,
  envReward: 0,
});

/** Plays the steps from INBOX and returns each step's revisit term (0 when absent). */
function revisits(weights: ReturnType<typeof defaultRewardWeights>, steps: RewardInput[]): number[] {
  let state = initialRewardState(INBOX);
  return steps.map((s) => {
    const r = computeReward(s, state, weights);
    state = r.state;
    return r.breakdown.terms.find((t) => t.term === 'revisit')?.value ?? 0;
  });
}

const TOUR = [
  step(INBOX, SENT, 'click sent'), // new
  step(SENT, INBOX, 'click inbox'), // back to the reset page
  step(INBOX, SENT, 'click sent'), // again, alternating: no loop term sees this
  step(SENT, DRAFTS, 'click drafts'), // new
  step(DRAFTS, DRAFTS, 'scroll'), // a no-op ends where it was
  step(DRAFTS, DRAFTS, 'bad', false), // invalid: invalid_action only
];

test('off by default: the default weights never pay it', () => {
  assert.equal(defaultRewardWeights().general.revisit, 0);
  assert.deepEqual(revisits(defaultRewardWeights(), TOUR), [0, 0, 0, 0, 0, 0]);
});

test('with a weight: every valid step ending on a visited state pays it, new states and invalid actions do not', () => {
  const w = parseRewardWeights({ general: { revisit: -0.2 } });
  assert.deepEqual(revisits(w, TOUR), [0, -0.2, -0.2, 0, -0.2, 0]);
  const r = computeReward(TOUR[1], computeReward(TOUR[0], initialRewardState(INBOX), w).state, w);
  assert.equal(r.breakdown.total, -0.1, 'valid_action 0.1, revisit -0.2');
  assert.match(summarizeBreakdown(r.breakdown), /^\+0\.1 valid, -0\.2 revisit = -0\.1$/);
  assert.throws(() => parseRewardWeights({ general: { revisit: 0.5 } }), /revisit/, 'a penalty, never a bonus');
});
