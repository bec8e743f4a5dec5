import type { Action } from '../lib/model-io/actions';
import type { ObservationRef, StartSessionInput } from '../lib/episode/episode-types';
import { MiniWobEnv, type RestartOptions } from '../env/miniwob';
import type { Observation } from '../env/types';
import type { SessionEnv } from './session-types';

/** A page's observation right after its start or reset, and how its replay went. */
export interface Look {
  obs: Observation;
  observation: ObservationRef;
  fastReplay?: 'fast' | 'settled';
  /** REAL: the site's client state (/finish) at this observation, when it was read already. */
  clientState?: unknown;
}

/** Replays without settle waits that reached their expected state, and those replayed again with them. */
export interface ReplayCounters {
  fast_replays: number;
  fast_replay_fallbacks: number;
}

/**
 * How this worker's sessions replay an episode's action path onto a page just back at the task's start, and
 * how often that went fast. `allowFast` (HALO_FAST_REPLAY) decides it in this one place: with it, a MiniWoB++
 * replay that has a lived state to check its end against restarts without the frame wait and replays without
 * the settle waits.
 */
export class Replays {
  private readonly counts: ReplayCounters = { fast_replays: 0, fast_replay_fallbacks: 0 };

  constructor(readonly allowFast: boolean) {}

  get counters(): Readonly<ReplayCounters> {
    return { ...this.counts };
  }

  /**
   * How a page about to replay `input` may restart in place (`MiniWobEnv.restartInPlace`): before a fast replay
   * without the frame wait, and without the pointer reset when the first replayed action moves the pointer.
   * `type` into an element clicks it, except a <select>: not counted.
   */
  restartOptions(input: StartSessionInput): RestartOptions {
    if (!this.fast(input)) return {};
    return { frame: false, pointer: !movesPointer(input.replay[0]) };
  }

  /**
   * A page just reset to the task's start walks `input.replay` and is observed. With `input.lived` a MiniWoB++
   * replay first runs without the settle waits (each ~60 ms, most of a replayed action's time) and, reaching the
   * lived state key, keeps the lived screenshot (taking one costs ~35 ms). A page that ends elsewhere that way
   * (a task whose state depends on timing) is reset and replayed again with the waits, and the state that
   * reaches is kept, as a replay without a lived state would.
   */
  async replayAndLook(
    env: SessionEnv,
    input: StartSessionInput,
    beat: (d: unknown) => void,
    /** Observes the page; with a screenshot reference, uses it instead of taking a screenshot. */
    look: (screenshotRef?: string) => Promise<Omit<Look, 'fastReplay'>>,
  ): Promise<Look> {
    const lived = input.lived;
    if (!(env instanceof MiniWobEnv) || !this.fast(input) || lived === undefined) {
      await replayOnto(env, input.replay, beat, true);
      return look();
    }
    await replayOnto(env, input.replay, beat, false);
    const first = await look(lived.screenshotRef);
    if (first.observation.stateKey === lived.stateKey) {
      this.counts.fast_replays++;
      return { ...first, fastReplay: 'fast' };
    }
    this.counts.fast_replay_fallbacks++;
    await env.restart(input.spec);
    await replayOnto(env, input.replay, beat, true);
    return { ...(await look()), fastReplay: 'settled' };
  }

  private fast(input: StartSessionInput): boolean {
    return this.allowFast && input.lived !== undefined && input.replay.length > 0;
  }
}

function movesPointer(a: Action): boolean {
  return a.type === 'click' || a.type === 'double_click' || a.type === 'move' || a.type === 'click_element' || (a.type === 'scroll' && a.x !== undefined && a.y !== undefined);
}

/** A started or reset page walks the episode's action path again, a heartbeat detail per action. */
export async function replayOnto(env: SessionEnv, replay: readonly Action[], beat: (d: unknown) => void, settle: boolean): Promise<void> {
  for (const [i, action] of replay.entries()) {
    await (env instanceof MiniWobEnv ? env.apply(action, { settle, frame: settle, force: !settle }) : env.apply(action));
    beat({ replayed: i + 1 });
  }
}

/** `HALO_FAST_REPLAY`: unset or 1 lets replays with an expected state skip their settle waits; 0 never does. */
export function fastReplayFromEnv(value = process.env.HALO_FAST_REPLAY): boolean {
  if (value === undefined || value === '' || value === '1') return true;
  if (value === '0') return false;
  throw new Error(`HALO_FAST_REPLAY must be 0 or 1 (0 replays every action with its settle wait), got ${JSON.stringify(value)}`);
}
