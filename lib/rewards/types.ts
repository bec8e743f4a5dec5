// Dense reward shaping: the contract between the step activity (which has the observations) and the
// pure reward calculator. Everything here is JSON-serialisable: the state travels through the workflow.

/** What a detector may look at: the page as the agent saw it, plus the site's persisted client state. */
export interface RewardView {
  url: string;
  /** Compact accessibility tree (the same text the policy sees). */
  axtree: string;
  /** The site's persisted client state (REAL: the JSON `/finish` renders), when the environment exposes it. */
  clientState?: unknown;
}

export interface RewardInput {
  /** REAL site name (gomail, gocalendar, omnizon, zilloft, ...) or null for environments without milestones. */
  site: string | null;
  /** The model's output parsed into an action and the environment executed it without error. */
  valid: boolean;
  /** Canonical text of the action (stable JSON); null when the output did not parse. */
  actionKey: string | null;
  before: RewardView;
  after: RewardView;
  /** true / false once the task is judged; null while it is not (yet). */
  taskSuccess: boolean | null;
  /** The environment's own reward for this step (MiniWoB raw reward; 0 elsewhere). */
  envReward: number;
}

/** Carried from step to step by the episode workflow: small and bounded. */
export interface RewardState {
  /** Milestones already fired this episode, as `site.milestone`. */
  fired: string[];
  /** Short hashes of the states visited so far. */
  visited: string[];
  /** The previous step's action key and the hash of the state it was taken in (loop detection). */
  lastActionKey: string | null;
  lastStateKey: string | null;
}

export interface RewardTerm {
  /** e.g. `valid_action`, `invalid_action`, `new_state`, `loop`, `task_success`, `env_reward`, `milestone:gomail.compose_opened` */
  term: string;
  value: number;
  /** One line of evidence, shown in the Temporal UI. */
  detail?: string;
}

export interface RewardBreakdown {
  total: number;
  terms: RewardTerm[];
}
