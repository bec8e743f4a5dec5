import { ApplicationFailure, patched } from '@temporalio/workflow';
import { describeAction, isValidAction, type AgentAction } from '../lib/model-io/actions';
import type { StepSessionResult } from '../lib/episode/episode-types';
import type { StepGroup } from '../lib/training/experience';
import { chooseCandidate, isZeroStdGroup } from '../lib/training/grpo';
import { fnv1a32, rewardForUnparsedOutput } from '../lib/rewards/shaping';
import type { DurableSession } from './durable-session';
import type { EpisodeContext, InvalidOutputReward, PlayedStep } from './episode-steps';
import { isSessionLost } from './session-lost';
import type { Sampled } from './sampler';

/**
 * Step grouping: every valid candidate runs from the current state in a session of its own (replaying the
 * action prefix), so each gets its shaped reward from the same state. The episode continues in the chosen
 * candidate's session; the others are closed.
 */

/** A candidate's run: in a fork of its own, or (unparseable) only the reward of its output. */
type CandidateRun = { fork: DurableSession; out: StepSessionResult } | { invalid: InvalidOutputReward };

/** Runs the step group of `sampled`, records it, and moves the episode to the chosen candidate's session. */
export async function runGroup(ep: EpisodeContext, sampled: Sampled, stepNo: number, more?: (draw: number) => Promise<Sampled>): Promise<PlayedStep> {
  const here = ep.session;
  const n = sampled.candidates.length;
  const runs = await runCandidates(ep, here, sampled, 0, stepNo);
  const { grown, rewards } = await drawMore(ep, here, sampled, runs, stepNo, more);
  const u = parseInt(fnv1a32(`${ep.sampler.drawKey ?? ep.workflowId}:${stepNo}`), 16) / 2 ** 32;
  // The episode goes on from one of the step's own n candidates: what it plays, and its success, stay the policy's.
  const chosen = chooseCandidate(rewards.slice(0, n), ep.input.grouping!.choose, u);
  ep.groups.push(stepGroup(grown, stepNo, chosen, rewards, n));
  const picked = runs[chosen];
  await continueInChosen(ep, runs, chosen);
  return { chosen, out: 'out' in picked ? picked.out : undefined, invalid: 'invalid' in picked ? picked.invalid : undefined };
}

function rewardOf(r: CandidateRun): number {
  return 'invalid' in r ? r.invalid.breakdown.total : r.out.shaped.total;
}

/** The candidates of one draw, each in a fork of its own at `here`'s state, all run at once. */
async function runCandidates(ep: EpisodeContext, here: DurableSession, drawn: Sampled, offset: number, stepNo: number): Promise<CandidateRun[]> {
  const total = offset + drawn.candidates.length;
  const settled = await Promise.allSettled(drawn.candidates.map((c, i) => runCandidate(ep, here, c.action, `${offset + i + 1}/${total}`, stepNo)));
  return allRunsOrThrow(settled);
}

/**
 * Dynamic sampling (DAPO): while every candidate scored the same and none succeeded, the group carries no
 * gradient, so it draws n more from the same state (train.dynamicSampling), up to maxCandidates; a group whose
 * candidates all succeeded has nothing left to find. The extra candidates only teach: their forks close as soon as
 * they are scored. Returns the group's candidates and every candidate's reward, the step's own draw first.
 */
async function drawMore(
  ep: EpisodeContext,
  here: DurableSession,
  sampled: Sampled,
  first: CandidateRun[],
  stepNo: number,
  more: ((draw: number) => Promise<Sampled>) | undefined,
): Promise<{ grown: Sampled; rewards: number[] }> {
  const rewards = first.map(rewardOf);
  if (first.some((r) => 'out' in r && r.out.success)) return { grown: sampled, rewards };
  const cap = ep.input.grouping?.maxCandidates ?? 0;
  const n = sampled.candidates.length;
  const candidates = [...sampled.candidates];
  for (let draw = 1; more && isZeroStdGroup(rewards) && candidates.length + n <= cap; draw++) {
    const extra = await more(draw);
    // The same observation and history write the same prompt blob; anything else is not one group.
    if (extra.promptRef !== sampled.promptRef || extra.grammarRef !== sampled.grammarRef) {
      throw ApplicationFailure.nonRetryable(`extra draw ${draw} of step ${stepNo} has prompt ${extra.promptRef}, not the group's ${sampled.promptRef}`, 'InvalidGroup');
    }
    const runs = await runCandidates(ep, here, extra, candidates.length, stepNo);
    for (const r of runs) if ('fork' in r) r.fork.closeLater();
    rewards.push(...runs.map(rewardOf));
    candidates.push(...extra.candidates);
  }
  return { grown: { ...sampled, candidates }, rewards };
}

/** One candidate in a new session at `here`'s state; a lost fork is opened again within the run's rebuild limit. */
async function runCandidate(ep: EpisodeContext, here: DurableSession, action: AgentAction, which: string, stepNo: number): Promise<CandidateRun> {
  if (!isValidAction(action)) return { invalid: rewardForUnparsedOutput(here.observation.stateKey, here.rewardState, ep.rewardWeights) };
  for (let attempt = 0; ; attempt++) {
    let fork: DurableSession | undefined;
    try {
      fork = await ep.sessions.open(here.path, ep.workflowId, `fork ${which} at step ${stepNo}: replay ${here.path.length} actions`, {
        near: here.handle,
        lived: here.observation,
      });
      // The fork continues this episode's shaping, not the one its replay rebuilt.
      fork.rewardState = here.rewardState;
      fork.observation = { ...fork.observation, goal: here.observation.goal };
      const out = await fork.stepOnce(action, `candidate ${which} step ${stepNo}: ${describeAction(action)}`);
      return { fork, out };
    } catch (err) {
      if (fork) await fork.closeQuietly();
      if (!isSessionLost(err) || attempt >= ep.run.maxSessionRebuilds) throw err;
      ep.budget.used++;
    }
  }
}

/** Every candidate's run, or the first failure thrown: the group is lost with the episode. */
function allRunsOrThrow(settled: PromiseSettledResult<CandidateRun>[]): CandidateRun[] {
  const failure = settled.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (!failure) return settled.map((r) => (r as PromiseFulfilledResult<CandidateRun>).value);
  // Forks already open must not keep their pages (and site slots).
  for (const r of settled) if (r.status === 'fulfilled' && 'fork' in r.value && r.value.fork) r.value.fork.closeLater();
  throw failure.reason;
}

/**
 * The group as training sees it: the prompt, every candidate's completion, finish reason, validity and reward, the
 * one played, and how many came from the step's own draw (the rest from dynamic sampling's extra draws).
 */
function stepGroup(sampled: Sampled, stepNo: number, chosen: number, rewards: number[], onPolicy: number): StepGroup {
  return {
    promptRef: sampled.promptRef,
    ...(sampled.grammarRef ? { grammarRef: sampled.grammarRef } : {}),
    step: stepNo,
    chosen,
    ...(onPolicy < sampled.candidates.length ? { firstDraw: onPolicy } : {}),
    candidates: sampled.candidates.map((completion, i) => ({ completion, reward: rewards[i] })),
  };
}

/** The episode goes on in the chosen candidate's fork (an unparseable one: in the session it was in); the other sessions are closed. */
async function continueInChosen(ep: EpisodeContext, runs: CandidateRun[], chosen: number): Promise<void> {
  const picked = runs[chosen];
  const losers = runs.flatMap((r, i) => (i !== chosen && 'fork' in r && r.fork ? [r.fork] : []));
  if ('fork' in picked && picked.fork) {
    losers.push(ep.session);
    ep.session = picked.fork;
  }
  // Not awaited here: a session on a worker that died would hold the episode for the schedule-to-start
  // timeout. The closes finish in the background and the episode waits for them only at its end.
  // Episodes started before this change awaited them here; patched() keeps their histories replayable.
  if (patched('background-session-closes')) for (const s of losers) s.closeLater();
  else await Promise.all(losers.map((s) => s.closeQuietly()));
}
