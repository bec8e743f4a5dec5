import { z } from 'zod';
import { ConfigError, formatConfigIssues } from './config-error';
import { dynamicSamplingProblems, historyBudgetProblems, poolProblems, rolloutProblems } from './config-checks';
import { replicaKey } from '../serving/policy-pool';
import { rewardWeightsSchema } from '../rewards/weights';
import { CREDENTIAL_NAMES } from '../serving/credentials';
import { GRAMMAR_WHITESPACE } from '../model-io/action-grammar';
import { VLLM_SERVERS } from '../model-io/grammar-blob';
import { TOOL_ACTIONS } from '../model-io/actions';

// One schema for every config file. Every value has a default, so an empty file is a valid config.
// Every section is strict (an unknown key is an error that names the closest valid key) and every number
// has an upper bound.

/** Seeds are 32-bit (MiniWoB++ and REAL seed their generators with them). */
export const MAX_SEED = 2_147_483_647;
/** Task lists (train.tasks, heldOutTasks, mcts.tasks): far above the ~125 MiniWoB++ and ~110 REAL tasks. */
export const MAX_TASKS = 10_000;

/** `train.seed` / `mcts.seed`: replaces the run id as the source of tasks and their seeds. */
const runSeed = (description: string) => z.number().int().min(0).max(MAX_SEED).optional().describe(description);

export const temporalSchema = z
  .strictObject({
    address: z.string().default('127.0.0.1:7233'),
    namespace: z.string().default('default'),
    controlTaskQueue: z.string().default('halo-control'),
    browserTaskQueue: z.string().default('halo-browser'),
  })
  .prefault({});

export const stackSchema = z
  .strictObject({
    home: z.string().default('runs').describe('folder for the Temporal database, blobs, logs and pid files'),
    uiPort: z.number().int().min(1).max(65535).default(8233),
    retentionDays: z.number().int().min(1).max(3650).default(30),
    browserWorkers: z.number().int().min(1).max(16).default(1),
    minFreeDiskGiB: z
      .number()
      .min(0)
      .max(1_000_000)
      .default(2)
      .describe(
        "free space the control worker's home folder (blobs, metrics) must have before each training iteration; below it the run pauses with the reason in its status (resume after freeing space, e.g. halo gc)",
      ),
    sqliteSynchronous: z
      .enum(['normal', 'full'])
      .default('normal')
      .describe(
        "the local dev server's SQLite synchronous pragma: normal survives a killed process; full also survives a box that loses power or is preempted, at the cost bench/RESULTS.md gives",
      ),
  })
  .prefault({});

export const policySchema = z
  .strictObject({
    backend: z
      .enum(['openai', 'colocated'])
      .default('openai')
      .describe('openai: an OpenAI-compatible server (vLLM) at baseUrl; colocated: the learner samples with its resident model'),
    baseUrl: z.string().url().default('http://127.0.0.1:8000/v1'),
    baseUrls: z
      .array(z.string().url())
      .min(1)
      .max(64)
      .optional()
      .describe(
        'openai backend: several servers of the same model (vLLM replicas, one per GPU) sampled as one pool: each request goes to the least-loaded healthy one, each loads every adapter version before it samples with it, and one that stops answering is drained and asked again later while the others go on. policy.baseUrl must be one of them (its default is the first replica ./launch.sh gpu starts). Absent: baseUrl alone',
      ),
    model: z.string().min(1).default('Qwen/Qwen3-VL-8B-Instruct'),
    credential: z
      .enum(CREDENTIAL_NAMES)
      .default('policy')
      .describe(
        'the API key the worker sends, by name: the worker maps policy / critic / baseline to its own environment (HALO_POLICY_API_KEY, HALO_POLICY_API_KEY, OPENAI_API_KEY; HALO_CREDENTIAL_<NAME>_ENV on the worker changes the variable)',
      ),
    apiKeyEnv: z.string().optional().describe('deprecated: accepted only when it names the variable the worker maps credential to; use credential'),
    temperature: z
      .number()
      .min(0)
      .max(2)
      .default(0.7)
      .describe(
        'sampling temperature of training candidates (GRPO) and of `halo episode`; greedy evaluations always decode at 0. 0 with train.numGenerations > 1 is refused by `halo train`: every candidate of a group would be the same',
      ),
    maxTokens: z.number().int().min(1).max(8192).default(256),
    timeoutMs: z.number().int().min(1000).max(600_000).default(60_000),
    historyLength: z.number().int().min(0).max(50).default(5),
    maxAttempts: z
      .number()
      .int()
      .min(1)
      .max(1000)
      .default(20)
      .describe('attempts per policy call while the server is down or failing (backoff 1s doubling to 30s): about 9 minutes by default'),
    tokenIds: z
      .enum(['auto', 'on', 'off'])
      .default('auto')
      .describe(
        "ask the server for the sampled token ids and their log-probs (vLLM's logprobs + return_token_ids), so the learner trains on exactly those tokens; auto: on, except for OpenAI's own API. A server asked that refuses the fields or answers without ids fails the request (no silent fallback): set off to sample without them, and the learner retokenises the text (ratio 1)",
      ),
    constrained: z
      .boolean()
      .default(false)
      .describe(
        "constrained action decoding: every sample is a valid action of the tool-call schema, element ids limited to those on the page and coordinates inside the grid (colocated: xgrammar in the learner; openai: vLLM's structured_outputs field with the same JSON schema). The learner applies the same grammar mask when it recomputes log-probs",
      ),
    actions: z
      .array(z.enum(TOOL_ACTIONS))
      .min(1)
      .refine((a) => new Set(a).size === a.length, 'actions must be distinct')
      .optional()
      .describe(
        "constrained decoding only: the computer_use actions the grammar admits (default: all of them). A smaller action space for tasks that need no other (MiniWoB++'s click tasks: [click_element, answer]); the prompt still describes the whole tool",
      ),
    /**
     * The free whitespace vLLM's xgrammar backend allows in constrained output. It is a server setting (the
     * request's own disable_any_whitespace is ignored), so this says how the server was started and the learner
     * compiles the same grammar: a mismatch fails the update (GrammarMismatch). `halo doctor` checks it.
     */
    grammarWhitespace: z
      .enum(GRAMMAR_WHITESPACE)
      .default('compact')
      .describe(
        'openai backend, constrained: the whitespace vLLM allows around JSON tokens. compact: vLLM started with --structured-outputs-config {"backend":"xgrammar","disable_any_whitespace":true} (docker-compose.yml, ./launch.sh gpu and docs/episodes.md do); any: the vLLM default, free whitespace, which no token budget bounds, so a sample may run out of tokens (an invalid action): a warning-level choice. The colocated sampler always samples compact',
      ),
    server: z
      .enum(VLLM_SERVERS)
      .default('vllm-0.33')
      .describe(
        'openai backend, constrained: the vLLM release that samples, which decides its compact separators (vllm-0.33, also 0.32: `,`/`:`; vllm-0.31, the Python 3.10 fallback: `, `/`: `). The grammar blob records the call and the learner compiles the same; `halo doctor` tells them apart',
      ),
  })
  .refine((p) => p.actions === undefined || p.constrained, {
    message: 'actions limits the constrained grammar: set policy.constrained: true (unconstrained output may be any action)',
    path: ['actions'],
  })
  .superRefine((p, ctx) => {
    if (!p.baseUrls) return;
    const keys = p.baseUrls.map(replicaKey);
    const twice = keys.find((k, i) => keys.indexOf(k) !== i);
    if (twice) ctx.addIssue({ code: 'custom', path: ['baseUrls'], message: `${twice} is listed twice: each replica once` });
    if (p.backend !== 'openai')
      ctx.addIssue({ code: 'custom', path: ['baseUrls'], message: 'a pool of servers is for policy.backend openai (the colocated learner samples itself)' });
    if (!keys.includes(replicaKey(p.baseUrl))) {
      ctx.addIssue({
        code: 'custom',
        path: ['baseUrl'],
        message: `${p.baseUrl} is not one of policy.baseUrls (${p.baseUrls.join(', ')}): set policy.baseUrl to one of them, e.g. the first`,
      });
    }
  })
  .prefault({});

export const episodeSchema = z
  .strictObject({
    env: z.enum(['miniwob', 'real']).default('miniwob'),
    task: z.string().min(1).default('click-button'),
    seed: z.number().int().min(0).max(MAX_SEED).default(0),
    maxSteps: z.number().int().min(1).max(200).default(10),
    maxSessionRebuilds: z.number().int().min(0).max(20).default(5),
    sessionStartTimeoutMs: z
      .number()
      .int()
      .min(1000)
      .max(3_600_000)
      .default(20_000)
      .describe('how long a session activity may wait for its browser worker before the session counts as lost'),
    heartbeatTimeoutMs: z.number().int().min(1000).max(600_000).default(10_000),
  })
  .prefault({});

/** How episodes (searches) reach updates, shared by train and mcts (docs/streaming.md). */
const rolloutSchema = z
  .enum(['iterations', 'stream'])
  .default('iterations')
  .describe(
    "iterations: an iteration starts its episodes (searches) together and updates when the last one ends. stream: every slot starts the next episode (search) as soon as one ends, sampled with the newest adapter served, and the learner updates as soon as an iteration's worth of complete groups (searches) is ready (maxStaleness bounds how far behind a sample may be; docs/streaming.md)",
  );

const streamSchema = z
  .strictObject({
    episodeRetries: z
      .number()
      .int()
      .min(0)
      .max(10)
      .default(1)
      .describe('a failed episode starts again in a fresh session this many times; past that its whole group is dropped (counted), since a partial group biases the baseline'),
    updatesPerRun: z
      .number()
      .int()
      .min(1)
      .max(1000)
      .default(10)
      .describe('updates per workflow run before it drains its in-flight episodes and continues as new (bounds the event history)'),
  })
  .prefault({})
  .describe('rollout stream only');

export const trainSchema = z
  .strictObject({
    runId: z
      .string()
      .regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$/, 'letters, digits, . _ - (max 81)')
      .default('grpo-local'),
    iterations: z.number().int().min(1).max(100_000).default(3),
    episodesPerIteration: z.number().int().min(1).max(256).default(2),
    parallelism: z.number().int().min(1).max(64).default(2).describe('episodes running at once'),
    tasks: z.array(z.string().min(1)).min(1).max(MAX_TASKS).default(['click-button', 'enter-text']),
    heldOutTasks: z.array(z.string().min(1)).max(MAX_TASKS).default([]),
    evalEvery: z.number().int().min(0).max(100_000).default(0).describe('greedy evaluation on heldOutTasks every K iterations (0: never)'),
    evalSeeds: z
      .array(z.number().int().min(0).max(MAX_SEED))
      .min(1)
      .max(1000)
      .optional()
      .describe('fixed seeds of the greedy evaluation: every held-out task with every seed, the same episodes each time; default: one seed per held-out task, drawn per iteration'),
    evalEverySteps: z
      .number()
      .int()
      .min(0)
      .max(10_000_000)
      .default(0)
      .describe(
        'greedy evaluation on heldOutTasks after each iteration that takes the run past a multiple of K environment steps (the steps of its episodes; 0: never); with evalEvery too, an iteration due by either evaluates once',
      ),
    grouping: z
      .enum(['step', 'episode', 'anchor'])
      .default('step')
      .describe(
        'step: N candidates from each state, each in a session forked by replay (MiniWoB++); episode: N rollouts of one task + seed, advantage = return − group mean; anchor: the rollouts of episode plus step groups formed afterwards from equal states across them (GiGPO), no forks',
      ),
    numGenerations: z.number().int().min(2).max(64).default(8).describe('N: candidates per state (step) or rollouts per task (episode, anchor)'),
    anchor: z
      .strictObject({
        episodeWeight: z.number().min(0).max(100).default(1).describe('weight of R_episode − mean R over the rollouts of one task + seed'),
        stepWeight: z.number().min(0).max(100).default(1).describe('weight of G_t − mean G over the steps acting from the same state'),
        discount: z.number().min(0).max(1).default(0.95).describe('γ of the step return G_t = Σ_k γ^k r_{t+k}'),
        balanceGroups: z
          .boolean()
          .default(false)
          .describe("scale each anchor group's step term by N / its member count, so a state few rollouts reached weighs as much as the start state (false: GiGPO)"),
      })
      .prefault({})
      .describe('grouping anchor: A = episodeWeight·(R − mean R) + stepWeight·(G_t − mean G over the anchor group); a step alone in its group keeps the episode term'),
    choose: z.enum(['best', 'sampled']).default('best').describe('which candidate the episode continues from (step grouping)'),
    dynamicSampling: z
      .strictObject({
        maxCandidates: z
          .number()
          .int()
          .min(0)
          .max(256)
          .default(0)
          .describe(
            'step grouping: a group whose N candidates all scored the same without success draws N more from the same state, again until the scores differ or the group holds this many (DAPO dynamic sampling); the episode still goes on from one of the first N; 0: off',
          ),
        explore: z
          .number()
          .min(0)
          .max(1)
          .default(0.5)
          .describe(
            "ε of those extra draws (colocated sampler): each token from (1 − ε)·π + ε·uniform over the tokens the grammar allows, with that mixture's log-probs, which the learner weights by π / mixture (capped at staleWeightCap); 0: plain draws",
          ),
      })
      .prefault({})
      .describe('more candidates for groups without signal'),
    rollout: rolloutSchema,
    maxStaleness: z
      .number()
      .int()
      .min(0)
      .max(8)
      .default(0)
      .describe(
        "iterations: 1 lets iteration i+1's rollouts sample from the newest adapter (one update behind) while the update on iteration i runs (at most 1). stream: a sample may be at most k updates behind when it is learned from; staler groups are dropped and counted. The learner's ratio against the sampler's log-probs corrects what is kept. 0: strictly on-policy, rollouts wait for the update",
      ),
    stream: streamSchema,
    staleWeightCap: z
      .number()
      .gt(0)
      .max(100)
      .default(5)
      .describe(
        "samples not drawn from the policy being trained (maxStaleness 1, a served policy, dynamicSampling's exploring draws): the learner clips the ratio to the weights at the start of the update and weights each token by π_now / π_sampler (AReaL's decoupled PPO), clamped to this cap: a token above it keeps a bounded gradient, where AReaL's example config masks it out",
      ),
    learningRate: z.number().gt(0).max(1).default(1e-6),
    klCoef: z.number().min(0).max(100).default(0.001),
    clipEpsilon: z.number().gt(0).lt(1).default(0.2),
    maxGradNorm: z.number().gt(0).max(10_000).default(1),
    lossType: z.literal('dr_grpo').default('dr_grpo'),
    gpuTaskQueue: z.string().min(1).default('gpu'),
    learnerHeartbeatTimeoutS: z.number().int().min(1).max(3600).default(60).describe('a learner that stops heartbeating for this long is presumed dead and its activity retried'),
    vllmBaseUrl: z.string().url().optional().describe('load each new adapter into this vLLM (policy.backend openai)'),
    baseModel: z
      .string()
      .min(1)
      .optional()
      .describe(
        "the learner's base model (its HALO_MODEL), sent with every learner request so a learner holding another model refuses; default: policy.model with the colocated backend, unchecked otherwise",
      ),
    seed: runSeed(
      "seed of the run's episodes: tasks and task seeds come from (seed, iteration, episode) instead of the run id, so runs with different ids play the same episodes; default: the run id",
    ),
    maxFailedEpisodeShare: z
      .number()
      .min(0)
      .max(1)
      .default(0.25)
      .describe("share of an iteration's episodes that may fail (counted in metrics, left out of the batch) before the run fails"),
  })
  .prefault({});

export const realSchema = z
  .strictObject({
    runId: z.string().min(1).default('0').describe('run_id sent to /config; "0" keeps episodes off the REAL leaderboard'),
    evaluateAtCap: z.boolean().default(false).describe('evaluate the final state at the step cap (official rule: reward 0, no evaluation)'),
    forkMode: z
      .enum(['snapshot', 'replay'])
      .default('snapshot')
      .describe(
        "how a step group's fork gets its parent's state. snapshot (default): copy the parent session's cookies, localStorage, IndexedDB and sessionStorage into a new context and open its URL, kept only if /finish (read from a copy of the storage) and the page the policy sees then match the parent's (else replay); replay: reset and replay the action prefix. snapshot also lets an episode start from a copy of its task's state after /config, kept by the browser worker and checked the same way. MiniWoB++ always replays, because its state lives in page scripts",
      ),
    scoring: z
      .enum(['official', 'training'])
      .optional()
      .describe(
        "how REAL episodes run and are judged. official: as agisdk 0.3.5's harness does: /finish is read once at the end (load and network idle within 1 s each, the first <pre> parsed as it is, reward 0 on a timeout or bad JSON, no retry), dialogs are dismissed, typing into a field replaces its value (fill), element actions time out after 500 ms and everything else after 5 s, Playwright's slow_mo of 1 s, a 0.5 s pause and load waits on every page and frame after each action, the site's state is read nowhere else (no shaped-reward reads, state copies or snapshot forks), nothing is evaluated at the step cap (evaluateAtCap ignored), and a task whose eval script is empty (gocalendar-11) runs and counts as a failure; training: faster and more lenient (/finish polled and reloaded for up to 10 s, dialogs accepted, typing appends, 20 s element timeouts, no slow_mo, the state read after every step for shaped rewards, from a copy of the storage in a context of its own so that no read writes into the judged state, snapshot forks). Default: official for halo eval, training for everything else",
      ),
  })
  .prefault({});

/** The limit `miniwob.timeLimit: raised` sets on every task: long enough that a slow policy never meets it. */
export const MINIWOB_RAISED_TIME_LIMIT_MS = 1_000_000;

// MiniWoB++ as the official package runs it, or with a time limit a VLM policy can live with.
export const miniwobSchema = z
  .strictObject({
    timeLimit: z
      .union([z.enum(['raised', 'official']), z.number().int().min(1000).max(86_400_000)])
      .default('raised')
      .describe(
        "episode time limit of every task. raised (default): 1,000,000 ms, because a VLM policy takes seconds per step and the official limit (10 s, or the task's own 7-30 s) would end most episodes with -1 while the policy is still thinking; official: each task's own limit, as published MiniWoB++ numbers were measured; a number: that many ms for every task",
      ),
    reward: z
      .enum(['raw', 'official'])
      .default('raw')
      .describe(
        "the environment reward an episode reports. raw (default): the task's reward in [-1, 1] without time penalty; official: the package's default, a positive reward scaled by the share of the time limit left (comparable only with timeLimit: official). Success is raw reward 1 either way: partial credit is a failure, visible as a reward below 1",
      ),
  })
  .prefault({});

// Agent-Q-style MCTS with step-level DPO (workflows/train-mcts.ts: `trainMcts`, run by the training engine → one `mctsSearch` per task).
export const mctsCriticSchema = z
  .strictObject({
    backend: z
      .enum(['openai', 'none'])
      .default('openai')
      .describe(
        'openai: an OpenAI-compatible server (usually the vLLM serving the base model) ranks candidates and values states; none: neutral priors (0.5) and no critic values, i.e. search outcomes only',
      ),
    baseUrl: z.string().url().default('http://127.0.0.1:8000/v1'),
    model: z.string().min(1).default('Qwen/Qwen3-VL-8B-Instruct').describe('the frozen critic: the base model, not an adapter'),
    credential: z.enum(CREDENTIAL_NAMES).default('critic').describe('the API key the worker sends, by name (see policy.credential)'),
    apiKeyEnv: z.string().optional().describe('deprecated: accepted only when it names the variable the worker maps credential to; use credential'),
    timeoutMs: z.number().int().min(1000).max(600_000).default(60_000),
    temperature: z.number().min(0).max(2).default(0),
    maxTokens: z.number().int().min(16).max(8192).default(256),
  })
  .prefault({});

export const mctsSchema = z
  .strictObject({
    runId: z
      .string()
      .regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$/, 'letters, digits, . _ - (max 81)')
      .default('mcts-local'),
    iterations: z.number().int().min(1).max(100_000).default(3),
    tasks: z
      .array(z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$/, 'a task name: letters, digits, . _ -'))
      .min(1)
      .max(MAX_TASKS)
      .default(['click-button'])
      .refine((t) => new Set(t).size === t.length, 'tasks must be distinct (searchesPerTask repeats a task)')
      .describe('every iteration runs searchesPerTask searches per task (seed derived from run id, iteration and task)'),
    searchesPerTask: z.number().int().min(1).max(64).default(1).describe('searches of each task per iteration, each on its own seed: more pairs per update from one task'),
    parallelism: z.number().int().min(1).max(64).default(1).describe('searches running at once'),
    numSimulations: z.number().int().min(1).max(10_000).default(50).describe('simulations (select, expand, evaluate, backpropagate) per search'),
    ucbConstant: z.number().min(0).max(100).default(1.414).describe('UCB1 exploration constant c'),
    maxChildren: z.number().int().min(1).max(32).default(5).describe('K: candidate actions sampled per expanded state (after dedupe, at most K children)'),
    alpha: z.number().min(0).max(1).default(0.5).describe('composite Q = alpha * Q_mcts + (1 - alpha) * Q_critic'),
    pairThreshold: z.number().min(0).max(1).default(0.1).describe('minimum composite-Q gap between two explored siblings for a DPO pair'),
    maxDepth: z.number().int().min(1).max(200).default(6).describe('depth cap of the tree and of rollouts (a node there that is not done is terminal with reward 0)'),
    valueMode: z
      .enum(['rollout', 'critic', 'shaped'])
      .default('rollout')
      .describe(
        "value of a new node: rollout = the policy plays on to a terminal state or maxDepth (reward 1 on success, else 0); critic = the critic's estimate for its state; shaped = the same rollout, a success worth 1 and any other episode half its shaped return from the search's root (rewards file) over shapedScale, at most 0.5 (test-time search values as rollout: the shaped return reads the task's success)",
      ),
    shapedScale: z
      .number()
      .gt(0)
      .max(1_000_000)
      .default(10)
      .describe(
        'valueMode shaped: the shaped return from the root of an unsuccessful episode that is worth 0.5, the most progress counts (e.g. 20: two page changes under configs/rewards-multistep.yaml)',
      ),
    temperature: z.number().gt(0).max(2).default(1).describe('sampling temperature of expansions and rollouts (1 keeps the sampler log-probs usable as DPO reference)'),
    continueAsNewEvery: z.number().int().min(1).max(1000).default(10).describe('a search continues as new after this many simulations (tree snapshot in the blob store)'),
    parkedSessions: z
      .number()
      .int()
      .min(0)
      .max(8)
      .default(2)
      .describe(
        'browser sessions a search keeps open between simulations: the next restore takes one at its node, steps one forward from an ancestor, or resets one in place instead of opening a new page (0: a new session per simulation)',
      ),
    critic: mctsCriticSchema,
    beta: z.number().gt(0).max(100).default(0.1).describe('DPO beta'),
    learningRate: z.number().gt(0).max(1).default(1e-6),
    maxGradNorm: z.number().gt(0).max(10_000).default(1),
    heldOutTasks: z.array(z.string().min(1)).max(MAX_TASKS).default([]).describe('tasks of the greedy evaluation (with every evalSeeds seed); empty: the training tasks'),
    evalEvery: z.number().int().min(0).max(100_000).default(0).describe('greedy evaluation with the new adapter every K iterations (0: never)'),
    evalEverySteps: z
      .number()
      .int()
      .min(0)
      .max(10_000_000)
      .default(0)
      .describe("greedy evaluation after each iteration that takes the run past a multiple of K environment steps (the searches' browser steps; 0: never)"),
    evalSeeds: z.array(z.number().int().min(0).max(MAX_SEED)).min(1).max(1000).default([0]).describe('seeds of the greedy evaluation episodes'),
    maxStaleness: z
      .number()
      .int()
      .min(0)
      .max(8)
      .default(0)
      .describe(
        "iterations: 1 lets iteration i+1's searches run with the newest adapter (one update behind) while the DPO update on iteration i's pairs runs (at most 1). stream: a search's pairs may be at most k updates behind when learned from; staler searches are dropped and counted. 0: searches wait for the update",
      ),
    rollout: rolloutSchema,
    stream: streamSchema,
    vllmBaseUrl: z.string().url().optional().describe('load each new adapter into this vLLM (policy.backend openai); later iterations sample with it'),
    seed: runSeed("seed of the searches: each task's seed comes from (seed, iteration, task) instead of the run id; default: the run id"),
    maxFailedSearchShare: z
      .number()
      .min(0)
      .max(1)
      .default(0.25)
      .describe("share of an iteration's searches that may fail (counted in metrics, their pairs left out) before the run fails"),
  })
  .refine((m) => m.valueMode !== 'critic' || m.critic.backend !== 'none', {
    message: 'valueMode critic needs a critic (critic.backend openai)',
    path: ['valueMode'],
  })
  .prefault({});

// Weights & Biases: every iteration's scalars also go to a W&B run (TensorBoard event files are written either way).
export const wandbSchema = z
  .strictObject({
    project: z
      .string()
      .min(1)
      .optional()
      .describe(
        "W&B project that receives every iteration's metrics (run id = the HALO run id); unset: no W&B. TensorBoard event files under <stack.home>/<run>/tensorboard are written either way",
      ),
    entity: z.string().min(1).optional().describe("W&B entity (team or user); unset: the API key's default"),
    mode: z
      .enum(['online', 'offline', 'disabled'])
      .optional()
      .describe(
        'online needs WANDB_API_KEY on the control worker; offline needs no network and keeps the run under <stack.home>/<run>/wandb for `wandb sync`; unset: WANDB_MODE, else online',
      ),
  })
  .prefault({});

export const configSchema = z
  .object({
    temporal: temporalSchema,
    stack: stackSchema,
    policy: policySchema,
    episode: episodeSchema,
    real: realSchema,
    miniwob: miniwobSchema,
    train: trainSchema,
    mcts: mctsSchema,
    wandb: wandbSchema,
    // Dense reward weights (defaults spelled out in configs/rewards.yaml).
    rewards: rewardWeightsSchema.prefault({}),
  })
  .strict();

export type HaloConfig = z.infer<typeof configSchema>;
export type PolicyConfig = z.infer<typeof policySchema>;
export type EpisodeConfig = z.infer<typeof episodeSchema>;
export type TrainConfig = z.infer<typeof trainSchema>;
export type MctsConfig = z.infer<typeof mctsSchema>;
export type MiniwobConfig = z.infer<typeof miniwobSchema>;

export { ConfigError };

/** Validate a parsed config object; the error lists every bad field by its dotted path. */
export function parseConfig(raw: unknown, source = 'config', opts: { historyBudget?: boolean } = {}): HaloConfig {
  const input = raw ?? {};
  const result = configSchema.safeParse(input);
  if (result.success) {
    const problems = [
      ...dynamicSamplingProblems(result.data),
      ...rolloutProblems(result.data),
      ...poolProblems(result.data),
      ...(opts.historyBudget === false ? [] : historyBudgetProblems(result.data)),
    ];
    if (problems.length) throw new ConfigError(`invalid ${source}:\n${problems.map((p) => `  ${p}`).join('\n')}`);
    return result.data;
  }
  const lines = formatConfigIssues(result.error.issues, configSchema, input);
  throw new ConfigError(`invalid ${source}:\n${lines.join('\n')}`);
}

/**
 * A config stored by a run that started under an earlier version of this schema (read back on continue-as-new
 * or resume): keys the schema no longer has are dropped instead of failing the run, which was validated when
 * it started. Anything else wrong is still an error. Returns the config and the dotted paths dropped.
 */
export function parseStoredConfig(raw: unknown, source = 'stored run config'): { cfg: HaloConfig; dropped: string[] } {
  const input = JSON.parse(JSON.stringify(raw ?? {})) as unknown;
  const dropped: string[] = [];
  for (let round = 0; round < 8; round++) {
    const result = configSchema.safeParse(input);
    if (result.success) return { cfg: result.data, dropped };
    const unknown = result.error.issues.filter((i) => i.code === 'unrecognized_keys');
    if (unknown.length === 0) break;
    for (const issue of unknown) {
      let at: unknown = input;
      for (const seg of issue.path) at = at !== null && typeof at === 'object' ? (at as Record<PropertyKey, unknown>)[seg] : undefined;
      if (at === null || typeof at !== 'object') continue;
      for (const key of issue.keys) {
        delete (at as Record<string, unknown>)[key];
        dropped.push([...issue.path, key].map(String).join('.'));
      }
    }
  }
  // A run already under way was checked when it started; a bound tightened since must not stop it mid-way.
  return { cfg: parseConfig(input, source, { historyBudget: false }), dropped };
}
