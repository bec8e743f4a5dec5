/**
 * What one episode, and one training iteration's fan-out of child workflows, put into Temporal, bounded from the config before anything runs, against the server's
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

/**
 * A child workflow in its parent's history: initiated, started, completed, and the two workflow tasks the
 * last two can wake (three events each). Checked against recorded training histories by its unit test.
 */
export const EVENTS_PER_CHILD = 3 + 2 * 3;
/** A child's start input (task, sampling policy, run context) and its result, past the actions its result lists. */
const CHILD_BYTES = 8192;
/**
 * One training iteration's own work, whatever its fan-out: config, disk check, the pending and the collected
 * batch, and twice (a pipelined run that stops learns from both) the batch, update, adapter load and metrics row.
 */
const ITERATION_ACTIVITIES = 20;
/** Start, patch markers, search attributes, the operator's signals, the close. */
const ITERATION_FIXED_EVENTS = 60;
const ITERATION_FIXED_BYTES = 256 * 1024;

export interface IterationShape {
  /** Child workflows collecting the iteration's experience (episodes, or MCTS searches). */
  collect: number;
  /** Greedy evaluation episodes per evaluation (0 when the run never evaluates). */
  evaluate: number;
  /** Evaluations one workflow run can hold: two when pipelined (the pending batch's, then the last one's at a stop). */
  evaluations: number;
  /** Actions a child's result may list (episode.maxSteps, or an MCTS best path's mcts.maxDepth). */
  actionsPerChild: number;
}

/** One workflow run of a training loop (each iteration continues as new): its children dominate its history. */
export function iterationFootprint(s: IterationShape): { children: number; events: number; historyBytes: number } {
  const children = s.collect + s.evaluations * s.evaluate;
  return {
    children,
    events: ITERATION_FIXED_EVENTS + EVENTS_PER_ACTIVITY * ITERATION_ACTIVITIES + EVENTS_PER_CHILD * children,
    historyBytes: ITERATION_FIXED_BYTES + children * (CHILD_BYTES + ACTION_BYTES * s.actionsPerChild),
  };
}

export interface IterationKeys {
  /** How the collection's child count is made, e.g. `train.episodesPerIteration 256 × train.numGenerations 64`. */
  collect: string;
  /** The settings to lower for fewer collection children. */
  lowerCollect: string;
  /** How the evaluation's episode count is made. */
  evaluate: string;
  lowerEvaluate: string;
}

/**
 * Why one iteration of this shape would pass Temporal's history limits in the training run's own history (its
 * child workflows' events and payloads), naming the settings to lower; empty when it fits.
 */
export function iterationHistoryProblems(s: IterationShape, keys: IterationKeys): string[] {
  const f = iterationFootprint(s);
  const L = TEMPORAL_LIMITS;
  const perChildEvents = EVENTS_PER_CHILD;
  const perChildBytes = CHILD_BYTES + ACTION_BYTES * s.actionsPerChild;
  const fixedEvents = f.events - perChildEvents * f.children;
  const fit = Math.min(Math.floor((L.historyEvents - fixedEvents) / perChildEvents), Math.floor((L.historyBytes - ITERATION_FIXED_BYTES) / perChildBytes));
  const evalPart = s.evaluate > 0 ? ` + ${s.evaluations > 1 ? `${s.evaluations} × ` : ''}${keys.evaluate} = ${s.evaluate} evaluation episodes` : '';
  const shape = `${keys.collect} = ${s.collect} child workflows${evalPart}`;
  const lower =
    s.evaluate > 0 && s.evaluations * s.evaluate > s.collect
      ? `${keys.lowerEvaluate} (or ${keys.lowerCollect})`
      : `${keys.lowerCollect}${s.evaluate > 0 ? ` or ${keys.lowerEvaluate}` : ''}`;
  const out: string[] = [];
  if (f.events > L.historyEvents) {
    out.push(`${shape}: one iteration's history reaches ${f.events} events, over Temporal's ${L.historyEvents}; about ${fit} children fit: lower ${lower}`);
  } else if (f.historyBytes > L.historyBytes) {
    out.push(`${shape}: one iteration's history reaches ${mib(f.historyBytes)}, over Temporal's ${mib(L.historyBytes)}; about ${fit} children fit: lower ${lower}`);
  }
  return out;
}
