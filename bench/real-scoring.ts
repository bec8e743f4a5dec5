/**
 * Success of one scripted agent under training and official REAL scoring, on the local REAL-protocol site switched
 * to each difference between the project's training settings and agisdk's harness (the cases of
 * test/integration/real-scoring.test.ts): the plain site, a /finish that renders or loads slowly, a Send behind
 * confirm(), a To field that opens with a value, an unscorable task, a persisted-state app that writes back
 * when /finish boots beside the agent's tab, and a recipient picker that opens in a new window. One in-process SessionManager (no Temporal), real Chromium.
 *
 *   node --import tsx bench/real-scoring.ts
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SessionManager } from '../activities/session';
import { BlobStore } from '../blob/store';
import type { Action } from '../lib/model-io/actions';
import type { RealScoring } from '../lib/episode/episode-types';
import { parseRewardWeights } from '../lib/rewards/weights';
import { startFakeRealSite, type FakeRealSite } from '../testing/fake-real-site';
import { parseAxtree } from '../testing/axtree';
import { printBenchHeader, printLoadAtEnd, runBench } from './bench-run';

const TARGET = 'brian.king@example.com';

function find(axtree: string, role: string, name: string): number {
  const hit = parseAxtree(axtree).find((l) => l.role === role && l.name === name);
  if (!hit) throw new Error(`no ${role} "${name}" on the page`);
  return hit.id;
}

const SEND: ((axtree: string) => Action)[] = [
  (t) => ({ type: 'click_element', id: find(t, 'button', 'Compose') }),
  (t) => ({ type: 'type', id: find(t, 'textbox', 'To'), text: TARGET }),
  (t) => ({ type: 'type', id: find(t, 'textbox', 'Subject'), text: 'Meeting notes' }),
  (t) => ({ type: 'type', id: find(t, 'textbox', 'Body'), text: 'Hi Brian, could you please send me the notes from our meeting? Thanks!' }),
  (t) => ({ type: 'click_element', id: find(t, 'button', 'Send') }),
];
const ANSWER = (): Action => ({ type: 'answer', text: 'I asked Brian for the meeting notes.' });

interface Case {
  name: string;
  set: (site: FakeRealSite) => void;
  task?: string;
  script?: ((axtree: string) => Action)[];
}

const CASES: Case[] = [
  { name: 'plain site', set: () => {} },
  { name: '/finish renders after 2.5 s', set: (s) => (s.finishDelayMs = 2_500) },
  { name: '/finish answers after 1.5 s', set: (s) => (s.finishLatencyMs = 1_500) },
  { name: 'Send behind confirm()', set: (s) => (s.confirmSend = true) },
  { name: 'To field opens with a value', set: (s) => (s.composeTo = 'someone@example.com') },
  { name: 'unscorable task (gocalendar-11)', set: () => {}, task: 'gocalendar-11' },
  {
    name: 'write-back app (undo-send outbox, 4 s)',
    set: (s) => (s.outboxMs = 4_000),
    script: [...SEND, () => ({ type: 'wait', seconds: 7 }), ANSWER],
  },
  {
    name: 'recipient picker in a new window',
    set: (s) => (s.contactPicker = true),
    script: [
      SEND[0],
      (t) => ({ type: 'click_element', id: find(t, 'button', 'Pick recipient') }),
      (t) => ({ type: 'click_element', id: find(t, 'button', TARGET) }),
      ...SEND.slice(2),
      ANSWER,
    ],
  },
];

function plain(site: FakeRealSite): void {
  Object.assign(site, { finishDelayMs: 0, finishLatencyMs: 0, confirmSend: false, composeTo: '', outboxMs: 0, contactPicker: false });
}

async function play(manager: SessionManager, blobs: BlobStore, c: Case, scoring: RealScoring, n: number): Promise<string> {
  let start: Awaited<ReturnType<SessionManager['start']>>;
  try {
    start = await manager.start({
      spec: { env: 'real', task: c.task ?? 'gomail-18', seed: 0 },
      replay: [],
      episodeId: `bench-${scoring}-${n}`,
      rewardWeights: parseRewardWeights({}),
      envOptions: { realRunId: '0', evaluateAtCap: false, realScoring: scoring },
    });
  } catch (err) {
    return `refused (${(err as Error).message.split('\n')[0]?.slice(0, 40)}…)`;
  }
  let axtree = (await blobs.get(start.observation.axtreeRef)).toString('utf8');
  let rewardState = start.rewardState;
  try {
    for (const [index, pick] of (c.script ?? [...SEND, ANSWER]).entries()) {
      const out = await manager.step({ sessionId: start.sessionId, index, action: pick(axtree), rewardState });
      if (out.done) return out.success ? 'success' : 'failure';
      rewardState = out.rewardState;
      axtree = (await blobs.get(out.observation.axtreeRef)).toString('utf8');
    }
    return 'not done';
  } catch (err) {
    return `error: ${(err as Error).message.split('\n')[0]}`;
  } finally {
    await manager.close(start.sessionId);
  }
}

async function main(): Promise<void> {
  printBenchHeader('real-scoring');
  const site = await startFakeRealSite();
  const blobRoot = await mkdtemp(join(tmpdir(), 'halo-real-scoring-'));
  const blobs = new BlobStore(blobRoot);
  const manager = new SessionManager({
    blobs,
    miniwobBaseUrl: 'http://127.0.0.1:9/',
    miniwobTasks: [],
    workerTaskQueue: 'in-process',
    workerName: 'bench',
    realOriginOverride: `${site.origin}/`,
  });
  try {
    console.log('| case | training scoring | official scoring |\n|---|---|---|');
    for (const [i, c] of CASES.entries()) {
      plain(site);
      c.set(site);
      const training = await play(manager, blobs, c, 'training', i);
      const official = await play(manager, blobs, c, 'official', i);
      console.log(`| ${c.name} | ${training} | ${official} |`);
    }
  } finally {
    await manager.shutdown();
    await site.close();
    await rm(blobRoot, { recursive: true, force: true });
  }
  printLoadAtEnd();
}

runBench(main);
