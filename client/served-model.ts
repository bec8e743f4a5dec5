import { ConfigError, type HaloConfig } from '../lib/config/config';
import { LOCAL_TEST_MODEL } from './config-overrides';
import { isLoopbackHost, resolveCredential } from '../lib/serving/credentials';

// `halo train|mcts --policy-url URL`: which model to ask that server for. A config the user did not name (or the local
// test config's tiny-random) cannot know what the server was started with, and a model it does not serve fails the
// run's first sample with a non-retryable 404; the server's own list (`GET /v1/models`) says.

interface ModelCard {
  id: string;
  parent?: string | null;
}

/** The models a server lists: vLLM's LoRA adapters carry their base model as `parent`, base models none. */
export async function servedModels(baseUrl: string, credential: unknown, env: NodeJS.ProcessEnv, timeoutMs = 5000): Promise<ModelCard[]> {
  const cred = resolveCredential({ credential, url: baseUrl, field: 'policy', fallback: 'policy' }, env);
  const u = new URL(baseUrl);
  // The key only where the workers would send it too: an allowed origin, over https or to this machine.
  const key = cred.ok && cred.key && (u.protocol === 'https:' || isLoopbackHost(u.hostname)) ? cred.key : undefined;
  const res = await fetch(`${baseUrl.replace(/\/+$/, '')}/models`, {
    headers: key ? { authorization: `Bearer ${key}` } : {},
    signal: AbortSignal.timeout(timeoutMs),
  });
  if (!res.ok) throw new Error(`HTTP ${res.status} from ${baseUrl}/models`);
  const data = ((await res.json()) as { data?: unknown }).data;
  if (!Array.isArray(data)) throw new Error(`${baseUrl}/models answered without a data list`);
  return data.filter((m): m is ModelCard => typeof m === 'object' && m !== null && typeof (m as ModelCard).id === 'string');
}

/**
 * The config with policy.model set to what the policy server serves, when the model was not chosen by the user (no
 * --config) or is the local test model. A model the server lists is kept; else its one base model is taken (a note
 * says so). Several base models and none named: an error before anything starts. A server that does not answer
 * keeps the config's model, said in a note (the run then fails on the server, with its own clear error).
 */
export async function withServedModel(cfg: HaloConfig, o: { configGiven: boolean; notes: string[]; env?: NodeJS.ProcessEnv }): Promise<HaloConfig> {
  const model = cfg.policy.model;
  if (cfg.policy.backend !== 'openai' || (o.configGiven && model !== LOCAL_TEST_MODEL)) return cfg;
  const url = cfg.policy.baseUrl;
  let cards: ModelCard[];
  try {
    cards = await servedModels(url, cfg.policy.credential, o.env ?? process.env);
  } catch (err) {
    o.notes.push(`--policy-url: could not ask ${url} which model it serves (${(err as Error).message}); policy.model stays ${model}`);
    return cfg;
  }
  if (cards.some((c) => c.id === model)) return cfg;
  const bases = cards.filter((c) => c.parent === undefined || c.parent === null).map((c) => c.id);
  if (bases.length !== 1) {
    throw new ConfigError(
      `--policy-url: ${url} serves ${bases.length ? bases.join(', ') : 'no model'}, not ${model}: name the model to sample with policy.model in a --config file`,
    );
  }
  o.notes.push(`--policy-url: policy.model ${bases[0]} (the model ${url} serves; the config named ${model})`);
  return { ...cfg, policy: { ...cfg.policy, model: bases[0] } };
}
