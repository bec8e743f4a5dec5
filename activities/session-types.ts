import type { Browser, BrowserContext } from 'playwright-core';
import type { MiniWobEnv } from '../env/miniwob';
import type { RealEnv } from '../env/real';
import type { ClientSnapshot } from '../env/real-snapshot';
import type { StartSessionInput, StepSessionResult } from '../lib/episode/episode-types';
import type { RewardView } from '../lib/rewards/types';
import type { RewardWeights } from '../lib/rewards/weights';

/** What a browser worker keeps per session, and which browser a session's task runs in. */

export type SessionEnv = MiniWobEnv | RealEnv;

export type BrowserKind = 'miniwob' | 'real' | 'real-official';

export function browserKind(input: StartSessionInput): BrowserKind {
  if (input.spec.env !== 'real') return 'miniwob';
  return input.envOptions?.realScoring === 'official' ? 'real-official' : 'real';
}

export interface Session {
  id: string;
  episodeId: string;
  context: BrowserContext;
  env: SessionEnv;
  applied: number;
  /** The actions applied since the reset, as JSON: a start asking for the same path from the same episode is its fork. */
  path: string[];
  /** The client state at `applied` actions, shared by the forks of one step group. */
  snapshot?: { applied: number; value: Promise<ClientSnapshot> };
  last?: StepSessionResult;
  /** The page as the policy last saw it: the "before" of the next step's reward. */
  view: RewardView;
  weights: RewardWeights;
  site: string | null;
  browser: Browser;
  /** When an activity last finished with the session, and how many run on it now (the idle sweep skips those). */
  lastUsed: number;
  busy: number;
}
