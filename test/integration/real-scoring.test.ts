import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import type { SessionManager } from '../../activities/session';
import type { BlobStore } from '../../blob/store';
import type { Action } from '../../lib/model-io/actions';
import type { RealScoring, StartSessionInput, StepSessionResult } from '../../lib/episode/episode-types';
import { parseRewardWeights } from '../../lib/rewards/weights';
import type { FakeRealSite } from '../../testing/fake-real-site';
import { parseAxtree } from '../../testing/axtree';
import { startRealSessions, type RealSessions } from '../../testing/real-sessions';

// Each difference between the project's training settings and agisdk's harness, shown on the local REAL-protocol
// site by one scripted agent: official scoring must give agisdk's verdict, and training scoring (the old
// behaviour) a different one, or the stand-in would not be showing the difference at all. The write-back app is
// the exception: training's own reads no longer change the judged state, so there both must agree.

const TASK = 'gomail-18';
const TARGET = 'brian.king@example.com';

let real: RealSessions;
let site: FakeRealSite;
let blobs: BlobStore;
let manager: SessionManager;

before(async () => {
  real = await startRealSessions('scoring-test');
  ({ site, blobs, manager } = real);
});

after(async () => {
  await real?.close();
});

/** Back to the plain stand-in: no slow /finish, no dialog, an empty To field. */
function plainSite(): void {
  site.finishDelayMs = 0;
  site.finishLatencyMs = 0;
  site.confirmSend = false;
  site.composeTo = '';
  site.outboxMs = 0;
  site.contactPicker = false;
}

function input(episodeId: string, scoring: RealScoring, task = TASK): StartSessionInput {
  return {
    spec: { env: 'real', task, seed: 0 },
    replay: [],
    episodeId,
    rewardWeights: parseRewardWeights({}),
    envOptions: { realRunId: '0', evaluateAtCap: false, realScoring: scoring },
  };
}

function find(axtree: string, role: string, name: string): number {
  const hit = parseAxtree(axtree).find((l) => l.role === role && l.name === name);
  assert.ok(hit, `no ${role} "${name}" in\n${axtree}`);
  return hit.id;
}

const SCRIPT: ((axtree: string) => Action)[] = [
  (t) => ({ type: 'click_element', id: find(t, 'button', 'Compose') }),
  (t) => ({ type: 'type', id: find(t, 'textbox', 'To'), text: TARGET }),
  (t) => ({ type: 'type', id: find(t, 'textbox', 'Subject'), text: 'Meeting notes' }),
  (t) => ({ type: 'type', id: find(t, 'textbox', 'Body'), text: 'Hi Brian, could you please send me the notes from our meeting? Thanks!' }),
  (t) => ({ type: 'click_element', id: find(t, 'button', 'Send') }),
  () => ({ type: 'answer', text: 'I asked Brian for the meeting notes.' }),
];

/** The scripted agent's whole episode under one scoring; returns its last step (the answer's verdict). */
async function play(episodeId: string, scoring: RealScoring, task = TASK, script = SCRIPT): Promise<StepSessionResult & { finishLoads: number }> {
  const finishBefore = site.hits('/finish').length;
  const start = await manager.start(input(episodeId, scoring, task));
  let axtree = (await blobs.get(start.observation.axtreeRef)).toString('utf8');
  let rewardState = start.rewardState;
  let out: StepSessionResult | undefined;
  try {
    for (const [index, pick] of script.entries()) {
      out = await manager.step({ sessionId: start.sessionId, index, action: pick(axtree), rewardState });
      assert.equal(out.actionError, undefined, `step ${index} (${scoring})`);
      rewardState = out.rewardState;
      axtree = (await blobs.get(out.observation.axtreeRef)).toString('utf8');
    }
  } finally {
    await manager.close(start.sessionId);
  }
  assert.ok(out?.done, 'the answer ends the episode');
  return { ...out, finishLoads: site.hits('/finish').length - finishBefore };
}

test('the plain stand-in: both scorings succeed, and official scoring loads /finish only where agisdk does', async () => {
  plainSite();
  const training = await play('plain-training', 'training');
  const official = await play('plain-official', 'official');
  assert.equal(training.success, true, training.reason ?? '');
  assert.equal(official.success, true, official.reason ?? '');
  // agisdk: once at setup, once at the answer. Training reads it at the start and after every step besides.
  assert.equal(official.finishLoads, 2);
  assert.ok(training.finishLoads > SCRIPT.length, `training loaded /finish ${training.finishLoads} times`);
});

test('a /finish that renders slowly: training polls until the JSON is there, official takes the first <pre> and scores 0', async () => {
  plainSite();
  // Later than agisdk looks (its load, slow_mo's 1 s pause after the navigation, network idle), sooner than
  // training's polling reloads the page (every 3.3 s).
  site.finishDelayMs = 2_500;
  try {
    const training = await play('slow-render-training', 'training');
    const official = await play('slow-render-official', 'official');
    assert.equal(training.success, true, training.reason ?? '');
    assert.equal(official.success, false);
    assert.equal(official.reward, 0);
    assert.match(official.reason ?? '', /official scoring: Invalid JSON format/);
  } finally {
    plainSite();
  }
});

test('a /finish that loads slowly: training waits, official gives up after 1 s and scores 0', async () => {
  plainSite();
  site.finishLatencyMs = 1_500;
  try {
    const training = await play('slow-load-training', 'training');
    const official = await play('slow-load-official', 'official');
    assert.equal(training.success, true, training.reason ?? '');
    assert.equal(official.success, false);
    assert.match(official.reason ?? '', /official scoring: Validation endpoint not yet available/);
  } finally {
    plainSite();
  }
});

test('a send guarded by confirm(): training accepts the dialog and sends, official dismisses it as agisdk does', async () => {
  plainSite();
  site.confirmSend = true;
  try {
    const training = await play('confirm-training', 'training');
    const official = await play('confirm-official', 'official');
    assert.equal(training.success, true, training.reason ?? '');
    assert.equal(official.success, false);
    assert.match(official.reason ?? '', /FAILURE/);
  } finally {
    plainSite();
  }
});

test('a field that opens with a value: training types after it (a wrong address), official replaces it as fill does', async () => {
  plainSite();
  site.composeTo = 'someone@example.com';
  try {
    const training = await play('prefilled-training', 'training');
    const official = await play('prefilled-official', 'official');
    assert.equal(training.success, false);
    assert.equal(official.success, true, official.reason ?? '');
    const sent = async (r: StepSessionResult) => {
      assert.ok(r.finalStateRef);
      const state = JSON.parse((await blobs.get(r.finalStateRef)).toString('utf8')) as { differences: { emails: { added: { to: string[] }[] } } };
      return state.differences.emails.added.map((e) => e.to.join(','));
    };
    // Typing lands where the click put the caret: the old value stays, with the address inside or after it.
    const [wrong] = await sent(training);
    assert.notEqual(wrong, TARGET);
    assert.equal(wrong.length, 'someone@example.com'.length + TARGET.length, wrong);
    assert.deepEqual(await sent(official), [TARGET]);
  } finally {
    plainSite();
  }
});

test('an unscorable task (empty eval script): training refuses it, official plays it and counts a failure', async () => {
  plainSite();
  await assert.rejects(manager.start(input('unscorable-training', 'training', 'gocalendar-11')), /cannot be scored/);
  const official = await play('unscorable-official', 'official', 'gocalendar-11');
  assert.equal(official.success, false);
  assert.equal(official.reward, 0);
});

test('a persisted-state app that writes back when /finish boots in a second tab: training reads the state from a copy and judges what official scoring judges', async () => {
  plainSite();
  // Undo send: the message waits in the outbox; an agent that waits past the window before answering has sent it.
  site.outboxMs = 4_000;
  const waitThenAnswer = [...SCRIPT.slice(0, 5), (): Action => ({ type: 'wait', seconds: 7 }), SCRIPT[5]];
  try {
    const training = await play('write-back-training', 'training', TASK, waitThenAnswer);
    const official = await play('write-back-official', 'official', TASK, waitThenAnswer);
    assert.equal(official.success, true, official.reason ?? '');
    assert.equal(training.success, true, training.reason ?? '');
    // Training still read the state after every step (the shaped rewards), while the message sat in the outbox:
    // the app those reads booted wrote its draft into a copy, never into the storage the answer was judged from.
    assert.ok(training.finishLoads > waitThenAnswer.length, `training loaded /finish ${training.finishLoads} times`);
    const history = async (r: StepSessionResult) => {
      assert.ok(r.finalStateRef);
      const state = JSON.parse((await blobs.get(r.finalStateRef)).toString('utf8')) as { actionhistory: { type: string }[] };
      return state.actionhistory.map((a) => a.type);
    };
    assert.deepEqual(await history(training), await history(official));
    assert.ok(!(await history(training)).includes('email/recoverOutbox'));
  } finally {
    plainSite();
  }
});

test('a recipient picker in a new window: official keeps both tabs and acts in the new one, as agisdk does; training follows it in the agent page, which leaves the picker no composer to fill', async () => {
  plainSite();
  site.contactPicker = true;
  const viaPicker: ((axtree: string) => Action)[] = [
    SCRIPT[0],
    (t) => ({ type: 'click_element', id: find(t, 'button', 'Pick recipient') }),
    // Seen in the new window (official) or in the agent page that followed it (training).
    (t) => ({ type: 'click_element', id: find(t, 'button', TARGET) }),
    // The picker closed itself: official is back in the composer it filled.
    ...SCRIPT.slice(2),
  ];
  try {
    const official = await play('picker-official', 'official', TASK, viaPicker);
    assert.equal(official.success, true, official.reason ?? '');
    assert.ok(official.finalStateRef);
    const state = JSON.parse((await blobs.get(official.finalStateRef)).toString('utf8')) as { differences: { emails: { added: { to: string[] }[] } } };
    assert.deepEqual(
      state.differences.emails.added.map((e) => e.to),
      [[TARGET]],
    );
    // Training left the composer for the picker's page: there is no Subject to type into any more.
    await assert.rejects(play('picker-training', 'training', TASK, viaPicker), /no textbox "Subject"/);
  } finally {
    plainSite();
  }
});
