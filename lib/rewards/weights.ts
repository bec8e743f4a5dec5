// Reward weights: one zod schema, every value with a default (configs/rewards.yaml spells the defaults out
// and a test keeps the two equal). Unknown sections, sites and milestones are errors that name them.
//
// Pure (zod + the `yaml` parser, no file access): workflow code may import it. The file loader,
// `loadRewardWeights(path)`, lives in host/rewards-file.ts because it needs node:fs.

import { z } from 'zod';
import { parse as parseYaml } from 'yaml';
import { closestKey, ConfigError, knownKeysAt } from '../config/config-error';

const MAX_ABS = 1000;
const bonus = (def: number, doc: string) => z.number().min(0).max(MAX_ABS).default(def).describe(doc);
const penalty = (def: number, doc: string) => z.number().min(-MAX_ABS).max(0).default(def).describe(doc);

export const generalWeightsSchema = z
  .object({
    valid_action: bonus(0.1, 'the action parsed and the environment executed it'),
    invalid_action: penalty(-0.5, 'unparseable output or an action the environment rejected (replaces valid_action)'),
    new_state: bonus(0.2, 'first visit of a state (url path + accessibility tree) in this episode'),
    loop: penalty(-1.0, 'the same action again on an unchanged state, which it did not change'),
    revisit: penalty(
      0,
      'state-visitation penalty: a valid action that ends on a state already visited this episode, its own included (off at 0; -0.1 to -0.3 against an agent that keeps to the same few states)',
    ),
    task_success: bonus(10, 'the task was judged successful'),
    env_reward_scale: z.number().min(0).max(MAX_ABS).default(1.0).describe("multiplier of the environment's own reward (MiniWoB raw reward)"),
  })
  .strict();

// Per-site milestone weights, in funnel order. Each fires at most once per episode.
export const gomailWeightsSchema = z
  .object({
    compose_opened: bonus(0.3, 'compose window open'),
    recipient_filled: bonus(0.2, 'To field filled'),
    subject_filled: bonus(0.2, 'Subject field filled'),
    send_visible: bonus(0.2, 'Send button on screen'),
    sent_confirmation: bonus(0.5, 'an email was sent'),
  })
  .strict();

export const gocalendarWeightsSchema = z
  .object({
    create_event_clicked: bonus(0.3, 'event editor open'),
    title_entered: bonus(0.2, 'event title typed'),
    datetime_set: bonus(0.2, 'a date/time field changed (or all-day chosen)'),
    save_clicked: bonus(0.2, 'editor saved'),
    event_created: bonus(0.5, 'an event or task exists in the state'),
  })
  .strict();

export const omnizonWeightsSchema = z
  .object({
    search_results: bonus(0.2, 'a search results page'),
    product_page: bonus(0.3, 'a product detail page'),
    add_to_cart: bonus(0.3, 'an item went into the cart'),
    cart_page: bonus(0.3, 'the cart page'),
    checkout_started: bonus(0.4, 'checkout reached (or an order placed)'),
  })
  .strict();

// Zilloft: the same scale as omnizon's shopping funnel. A submitted search is the cheapest step (one or two
// actions), like omnizon.search_results: 0.2. Setting a price/beds filter takes several actions (open a
// dropdown, pick a bound) and is what most v2 zilloft goals constrain: 0.3. Opening a listing is where
// "Request a tour" / "Contact agent" live, like omnizon.product_page: 0.3. The three sum to 0.8, under
// the other sites' 1.4-1.5 because there is no milestone for the final submission (task_success pays it).
export const zilloftWeightsSchema = z
  .object({
    search_performed: bonus(0.2, 'a location search ran'),
    filters_applied: bonus(0.3, 'a price/beds/baths filter set'),
    listing_viewed: bonus(0.3, "a listing's page open"),
  })
  .strict();

const siteSchemas = {
  gomail: gomailWeightsSchema,
  gocalendar: gocalendarWeightsSchema,
  omnizon: omnizonWeightsSchema,
  zilloft: zilloftWeightsSchema,
};

export const sitesWeightsSchema = z
  .object({
    gomail: gomailWeightsSchema.prefault({}),
    gocalendar: gocalendarWeightsSchema.prefault({}),
    omnizon: omnizonWeightsSchema.prefault({}),
    zilloft: zilloftWeightsSchema.prefault({}),
  })
  .strict();

export const rewardWeightsSchema = z
  .object({
    general: generalWeightsSchema.prefault({}),
    sites: sitesWeightsSchema.prefault({}),
  })
  .strict();

export type RewardWeights = z.infer<typeof rewardWeightsSchema>;
export type GeneralWeights = z.infer<typeof generalWeightsSchema>;

/** Sites that have milestone weights. */
export const WEIGHTED_SITES: readonly string[] = Object.keys(siteSchemas);

/** The milestone weights of `site`, or undefined for a site without milestones. */
export function siteWeights(weights: RewardWeights, site: string | null): Readonly<Record<string, number>> | undefined {
  if (site === null || !Object.hasOwn(weights.sites, site)) return undefined;
  return (weights.sites as Record<string, Record<string, number>>)[site];
}

export function defaultRewardWeights(): RewardWeights {
  return rewardWeightsSchema.parse({});
}

/** What an unknown key at `path` is, with the known names, for error messages. */
function unknownKeyText(path: readonly PropertyKey[]): string {
  const p = path.map(String);
  if (p.length === 0) return `unknown section (known: general, sites)`;
  if (p.length === 1 && p[0] === 'general') return `unknown general weight (known: ${Object.keys(generalWeightsSchema.shape).join(', ')})`;
  if (p.length === 1 && p[0] === 'sites') return `unknown site (sites with milestones: ${WEIGHTED_SITES.join(', ')})`;
  if (p.length === 2 && p[0] === 'sites' && p[1] in siteSchemas) {
    const shape = siteSchemas[p[1] as keyof typeof siteSchemas].shape;
    return `unknown ${p[1]} milestone (known: ${Object.keys(shape).join(', ')})`;
  }
  return 'unknown key';
}

/** Validates a parsed weights object; the error names every bad field by its dotted path. */
export function parseRewardWeights(raw: unknown, source = 'reward weights'): RewardWeights {
  const result = rewardWeightsSchema.safeParse(raw ?? {});
  if (result.success) return result.data;
  const lines: string[] = [];
  for (const issue of result.error.issues) {
    const path = issue.path.map(String);
    if (issue.code === 'unrecognized_keys') {
      for (const key of issue.keys) {
        const near = closestKey(key, knownKeysAt(rewardWeightsSchema, issue.path, raw ?? {}));
        const hint = near ? `; did you mean ${[...path, near].join('.')}?` : '';
        lines.push(`  ${[...path, key].join('.')}: ${unknownKeyText(issue.path)}${hint}`);
      }
    } else {
      lines.push(`  ${path.length ? path.join('.') : '(root)'}: ${issue.message}`);
    }
  }
  throw new ConfigError(`invalid ${source}:\n${lines.join('\n')}`);
}

/** Parses YAML text (empty text = all defaults). */
export function parseRewardWeightsYaml(text: string, source = 'reward weights'): RewardWeights {
  let raw: unknown;
  try {
    raw = parseYaml(text);
  } catch (err) {
    throw new ConfigError(`${source} is not valid YAML: ${(err as Error).message}`);
  }
  return parseRewardWeights(raw, source);
}
