/**
 * What one episode puts into Temporal, bounded from the config before anything runs, against the server's
 * limits (docs: workflow-execution/limits): a payload errors at 2 MB, a history at 51,200 events or 50 MB.
 * Past them a run fails mid-way (an episode that cannot record its trajectory, a history the server
 * terminates), after its rollouts were paid for; here it fails at `halo train` with the value to lower.
 *
 * The bounds are upper bounds, checked against real histories by the episode tests: an activity adds at
 * most six events (scheduled, started, completed, and the workflow task it wakes), a sampled token at most
 * BYTES_PER_TOKEN bytes of JSON text (a long token, escaped), and a fork carries the action path it replays.
 */

export const TEMPORAL_LIMITS = { payloadBytes: 2 * 1024 * 1024, historyEvents: 51_200, historyBytes: 50 * 1024 * 1024 } as const;

export const EVENTS_PER_ACTIVITY = 6;
export const BYTES_PER_TOKEN = 16;
/** An action as a fork's replay input and a trajectory step carry it (JSON), with room for typed text. */
const ACTION_BYTES = 256;
/** A step's fixed share: references, summaries, the observation, the shaped reward. */
const STEP_BYTES = 4096;
/** reset, close, trajectory, finish, and the session's bookkeeping around them. */
const EPISODE_ACTIVITIES = 6;

export interface EpisodeShape {
  /** Candidates sampled per state: train.numGenerations with step grouping, else 1. */
  n: number;
  /** Each candidate runs in a forked session (step grouping): one open, step and close each. */
  forks: boolean;
  maxSteps: number;
  maxTokens: number;
}

export interface EpisodeFootprint {
  events: number;
  historyBytes: number;
  /** The largest single payload: the sampler's answer or the trajectory the episode records. */
  samplePayloadBytes: number;
  trajectoryPayloadBytes: number;
}

export function episodeFootprint(s: EpisodeShape): EpisodeFootprint {
  const completions = s.n * (BYTES_PER_TOKEN * s.maxTokens + 512); // as samplingPayloadProblem
  const activitiesPerStep = 3 + (s.forks ? 3 * s.n : 1); // prompt, sample, parse; then the step(s)
  const events = EVENTS_PER_ACTIVITY * (EPISODE_ACTIVITIES + s.maxSteps * activitiesPerStep);
  // A fork at step k carries the k actions it replays; summed over the steps that is maxSteps²/2 per candidate.
  const forkBytes = s.forks ? s.n * (s.maxSteps * STEP_BYTES + (ACTION_BYTES * s.maxSteps * (s.maxSteps + 1)) / 2) : 0;
  const trajectoryPayloadBytes = s.maxSteps * (STEP_BYTES + ACTION_BYTES + (s.forks ? s.n * 512 : 0));
  // The texts travel twice (the sampler's answer, the parser's input); the previews once more.
  const historyBytes = s.maxSteps * (2 * completions + STEP_BYTES) + forkBytes + trajectoryPayloadBytes;
  return { events, historyBytes, samplePayloadBytes: completions, trajectoryPayloadBytes };
}

export interface EpisodeKeys {
  n: string;
  maxSteps: string;
  maxTokens: string;
}

const mib = (b: number) => `${(b / 1024 / 1024).toFixed(1)} MiB`;

/**
 * Why one episode of this shape would pass a Temporal limit, naming the config values to lower (their dotted
 * paths in `keys`); empty when it fits.
 */
export function episodeHistoryProblems(s: EpisodeShape, keys: EpisodeKeys): string[] {
  const f = episodeFootprint(s);
  const L = TEMPORAL_LIMITS;
  const shape = `${s.n > 1 ? `${keys.n} ${s.n} × ` : ''}${keys.maxSteps} ${s.maxSteps} × ${keys.maxTokens} ${s.maxTokens}`;
  const lower = (key: string) => (s.n > 1 ? `${key} or ${keys.n}` : key);
  const out: string[] = [];
  const sampling = samplingPayloadProblem(s.n, s.maxTokens, keys);
  if (sampling) out.push(sampling);
  if (f.trajectoryPayloadBytes > L.payloadBytes) {
    out.push(
      `${shape}: an episode's trajectory record reaches ${mib(f.trajectoryPayloadBytes)}, over Temporal's ${mib(L.payloadBytes)} payload limit: lower ${lower(keys.maxSteps)}`,
    );
  }
  if (f.events > L.historyEvents) {
    out.push(`${shape}: an episode's history reaches ${f.events} events, over Temporal's ${L.historyEvents}: lower ${lower(keys.maxSteps)}`);
  }
  if (f.historyBytes > L.historyBytes) {
    const byTokens = 2 * s.maxSteps * s.n * BYTES_PER_TOKEN * s.maxTokens > f.historyBytes / 2;
    out.push(`${shape}: an episode's history reaches ${mib(f.historyBytes)}, over Temporal's ${mib(L.historyBytes)}: lower ${lower(byTokens ? keys.maxTokens : keys.maxSteps)}`);
  }
  return out;
}

/** One sampling call's answer (n completions of up to maxTokens tokens) against the payload limit. */
export function samplingPayloadProblem(n: number, maxTokens: number, keys: Pick<EpisodeKeys, 'n' | 'maxTokens'>): string | null {
  const bytes = n * (BYTES_PER_TOKEN * maxTokens + 512);
  if (bytes <= TEMPORAL_LIMITS.payloadBytes) return null;
  return `${keys.n} ${n} × ${keys.maxTokens} ${maxTokens}: one sampling call answers up to ${mib(bytes)} of completions, over Temporal's ${mib(TEMPORAL_LIMITS.payloadBytes)} payload limit: lower ${keys.maxTokens} or ${keys.n}`;
}
