// Dense reward shaping for one step: general terms (valid/invalid action, first visit of a state, a visit of a
// state seen before, loops),
// the site's milestones (each at most once per episode), the environment's own reward and task success.
//
// Pure and deterministic: no I/O, no Node APIs, no clock, no randomness. The episode workflow calls it
// directly and carries the returned RewardState (small, JSON) to the next step.
//
// Decisions:
//  - State key = FNV-1a 32-bit hash of the page's origin + path and its accessibility tree, normalised:
//      * the client state is left out: the `/finish` JSON carries an action log with timestamps, so it changes
//        on every step even when nothing visible does (every step would be "new", no loop could be seen); it
//        may also be present on one step and absent on the next. It is the agent's view that defines a state.
//      * the URL's query and fragment are left out, and so are element ids, `@(x,y)` positions and the
//        `focused` flag, and free-text values count only as empty / filled: all of these can be varied at
//        will (scroll 1 px, tab, type another letter, goto ?x=N) and would otherwise pay new_state forever.
//        When a query matters (a search), the page content differs anyway. Anchor grouping needs the typed
//        text told apart and uses its own key (`anchorStateKey`), which keeps a hash of each filled value.
//  - An invalid action earns invalid_action and nothing from the page: no new_state, no milestone. It can
//    still be a loop (the same rejected action again on the same unchanged page), and environment facts
//    (env reward, task success) are reported as they are. Its resulting page is still recorded as visited.
//  - new_state needs a valid action that changed the state, to a state not seen this episode, on an
//    http(s) page (not data:/about: pages the agent could write itself with goto, nor /finish or /config).
//  - revisit (state-visitation penalty, off by default) is new_state's mirror: a valid action whose resulting
//    state was already seen this episode pays it, a no-op included, so repeating actions that lead nowhere new
//    costs something even when they alternate and the loop term (same action, same state) never sees them.
//    An invalid action pays invalid_action instead, never both.
//  - `visited` keeps at most 512 keys, dropping the oldest: it bounds the workflow payload (~6 KB) and never
//    evicts in practice, since a step adds at most two keys and episodes stop at 200 steps.

import { milestonesFor } from './sites';
import { splitUrl, parseAxLine } from './milestones';
import type { RewardBreakdown, RewardInput, RewardState, RewardTerm, RewardView } from './types';
import type { RewardWeights } from './weights';

export const MAX_VISITED = 512;
const MAX_STATE_CHARS = 400_000;
const MAX_STATE_LINES = 5000;

/** FNV-1a, 32 bits, over UTF-16 code units; 8 lower-case hex digits. */
export function fnv1a32(s: string): string {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h.toString(16).padStart(8, '0');
}

/**
 * The accessibility tree as the state key sees it: one canonical line per element without its id,
 * position or focus, with free-text values reduced to empty (`value=""`) or filled (`value=*`); values of
 * selects (lines with `options=`) are kept. Lines that are not element lines are kept trimmed.
 */
export function normaliseAxtree(text: unknown): string {
  return normaliseTree(text, () => '*');
}

/**
 * The accessibility tree as the anchor key sees it: as `normaliseAxtree`, except that a filled text field
 * keeps a hash of its text (`value=#<fnv1a32>`). Anchor grouping compares the steps taken from one state, and
 * the pages after typing the right and the wrong recipient are different states to act from; the hash keeps
 * the typed text itself out of anything that stores or shows a key.
 */
export function normaliseAxtreeForAnchor(text: unknown): string {
  return normaliseTree(text, (value) => `#${fnv1a32(value)}`);
}

/** The shared normalisation; `filled` writes a non-empty free-text value. */
function normaliseTree(text: unknown, filled: (value: string) => string): string {
  if (typeof text !== 'string' || text.length === 0) return '';
  const src = text.length > MAX_STATE_CHARS ? text.slice(0, MAX_STATE_CHARS) : text;
  const out: string[] = [];
  for (const line of src.split('\n', MAX_STATE_LINES)) {
    const n = parseAxLine(line);
    if (!n) {
      const t = line.trim();
      if (t) out.push(t);
      continue;
    }
    let s = `${n.role} ${JSON.stringify(n.name)}`;
    if (n.value !== null) s += n.props.options !== undefined ? ` value=${JSON.stringify(n.value)}` : n.value.trim() ? ` value=${filled(n.value)}` : ' value=""';
    for (const k of Object.keys(n.props).sort()) s += ` ${k}=${JSON.stringify(n.props[k])}`;
    for (const f of n.flags) if (f !== 'focused') s += ` ${f}`;
    out.push(s);
  }
  return out.join('\n');
}

function viewField(view: unknown, key: 'url' | 'axtree'): string {
  try {
    if (view !== null && typeof view === 'object') {
      const v = (view as Record<string, unknown>)[key];
      return typeof v === 'string' ? v : '';
    }
  } catch {
    // hostile object
  }
  return '';
}

/** Where the page is, without query and fragment: `https://host/path`, `data:<payload>`, or the raw text. */
function location(url: string): string {
  const p = splitUrl(url);
  if (!p.scheme) return url.slice(0, 2048);
  return p.origin ? p.origin + p.path : `${p.scheme}:${p.path.slice(0, 2048)}`;
}

/** Short hash of a view: its origin + path and normalised accessibility tree (client state excluded). */
export function stateKey(view: RewardView): string {
  return fnv1a32(location(viewField(view, 'url')) + '\n' + normaliseAxtree(viewField(view, 'axtree')));
}

/**
 * Anchor grouping's key of a view (lib/training/anchor-groups.ts): as `stateKey`, but filled text fields count by their
 * text (hashed). Shaping keeps `stateKey`, where typing another letter must not pay a new state.
 */
export function anchorStateKey(view: RewardView): string {
  return fnv1a32(location(viewField(view, 'url')) + '\n' + normaliseAxtreeForAnchor(viewField(view, 'axtree')));
}

function isWebPage(view: unknown): boolean {
  const p = splitUrl(viewField(view, 'url'));
  return (p.scheme === 'http' || p.scheme === 'https') && !/^\/(finish|config)\/?$/i.test(p.path);
}

function detectSafely(detect: () => string | null): string | null {
  try {
    const out = detect();
    return typeof out === 'string' && out ? out : null;
  } catch {
    return null;
  }
}

/**
 * The state at reset. The initial page counts as visited. With `site`, milestones whose evidence is
 * already on the initial page are marked fired: the agent did nothing to earn them.
 */
export function initialRewardState(initialView?: RewardView, site?: string | null): RewardState {
  const fired: string[] = [];
  if (initialView !== undefined && typeof site === 'string') {
    for (const d of milestonesFor(site)) {
      if (detectSafely(() => d.detect(initialView, initialView))) fired.push(`${site}.${d.name}`);
    }
  }
  return { fired, visited: initialView === undefined ? [] : [stateKey(initialView)], lastActionKey: null, lastStateKey: null };
}

/** A usable copy of whatever state came in (a malformed one starts afresh rather than throwing). */
function cleanState(state: unknown): RewardState {
  const strings = (v: unknown): string[] => (Array.isArray(v) ? v.filter((x): x is string => typeof x === 'string') : []);
  try {
    const s = state !== null && typeof state === 'object' ? (state as Partial<Record<keyof RewardState, unknown>>) : {};
    return {
      fired: strings(s.fired),
      visited: strings(s.visited).slice(-MAX_VISITED),
      lastActionKey: typeof s.lastActionKey === 'string' ? s.lastActionKey : null,
      lastStateKey: typeof s.lastStateKey === 'string' ? s.lastStateKey : null,
    };
  } catch {
    return { fired: [], visited: [], lastActionKey: null, lastStateKey: null };
  }
}

/** Rounds to 1e-9 so sums of decimal weights print cleanly (0.1 + 0.2 = 0.3); never returns -0. */
export function roundReward(x: number): number {
  const r = Math.round(x * 1e9) / 1e9;
  return r === 0 ? 0 : r;
}

function clipText(s: string, n: number): string {
  return s.length <= n ? s : s.slice(0, n - 1) + '…';
}

/** Reward of one step, and the state to carry to the next. Pure; never mutates its arguments. */
export function computeReward(input: RewardInput, state: RewardState, weights: RewardWeights): { breakdown: RewardBreakdown; state: RewardState } {
  return computeRewardWithKeys(input, stateKey(input.before), stateKey(input.after), state, weights);
}

/**
 * A model output that did not parse never reaches the browser: the workflow scores it from the state key of
 * the observation it was sampled on (no page text needed), by the same rules as every other step.
 */
export function rewardForUnparsedOutput(currentStateKey: string, state: RewardState, weights: RewardWeights): { breakdown: RewardBreakdown; state: RewardState } {
  const view: RewardView = { url: '', axtree: '' };
  return computeRewardWithKeys(
    { site: null, valid: false, actionKey: null, before: view, after: view, taskSuccess: null, envReward: 0 },
    currentStateKey,
    currentStateKey,
    state,
    weights,
  );
}

function computeRewardWithKeys(
  input: RewardInput,
  keyBefore: string,
  keyAfter: string,
  state: RewardState,
  weights: RewardWeights,
): { breakdown: RewardBreakdown; state: RewardState } {
  const g = weights.general;
  const prev = cleanState(state);
  const terms: RewardTerm[] = [];
  const add = (term: string, value: number, detail?: string): void => {
    if (!Number.isFinite(value) || value === 0) return;
    terms.push(detail === undefined ? { term, value: roundReward(value) } : { term, value: roundReward(value), detail });
  };

  const valid = input.valid === true;
  const actionKey = typeof input.actionKey === 'string' ? input.actionKey : null;
  const visited = [...prev.visited];
  const fired = [...prev.fired];
  const seen = new Set(visited);

  if (valid) add('valid_action', g.valid_action);
  else add('invalid_action', g.invalid_action, actionKey === null ? 'output did not parse into an action' : `rejected: ${clipText(actionKey, 120)}`);

  if (valid && keyAfter !== keyBefore && !seen.has(keyAfter) && isWebPage(input.after)) {
    add('new_state', g.new_state, `state ${keyAfter}`);
  }
  if (valid && (keyAfter === keyBefore || seen.has(keyAfter))) {
    add('revisit', g.revisit, `state ${keyAfter} visited before`);
  }

  if (actionKey !== null && actionKey === prev.lastActionKey && keyBefore === prev.lastStateKey && keyAfter === keyBefore) {
    add('loop', g.loop, `same action again on unchanged state ${keyBefore}: ${clipText(actionKey, 100)}`);
  }

  const site = typeof input.site === 'string' ? input.site : null;
  if (valid && site !== null) {
    const siteWeights = Object.hasOwn(weights.sites, site) ? (weights.sites as Record<string, Record<string, number>>)[site] : undefined;
    for (const d of milestonesFor(site)) {
      const w = siteWeights?.[d.name];
      const id = `${site}.${d.name}`;
      if (typeof w !== 'number' || w === 0 || fired.includes(id)) continue;
      const evidence = detectSafely(() => d.detect(input.after, input.before));
      if (evidence) {
        add(`milestone:${id}`, w, evidence);
        fired.push(id);
      }
    }
  }

  const env = input.envReward;
  if (typeof env === 'number' && Number.isFinite(env) && env !== 0) {
    add('env_reward', env * g.env_reward_scale, `environment reward ${env} × ${g.env_reward_scale}`);
  }
  if (input.taskSuccess === true) add('task_success', g.task_success);

  for (const k of [keyBefore, keyAfter]) {
    if (!seen.has(k)) {
      seen.add(k);
      visited.push(k);
    }
  }

  const total = roundReward(terms.reduce((s, t) => s + t.value, 0));
  return {
    breakdown: { total, terms },
    state: { fired, visited: visited.slice(-MAX_VISITED), lastActionKey: actionKey, lastStateKey: keyBefore },
  };
}

const LABELS: Record<string, string> = {
  valid_action: 'valid',
  invalid_action: 'invalid',
  new_state: 'new state',
  loop: 'loop',
  revisit: 'revisit',
  env_reward: 'env reward',
  task_success: 'task success',
};

function signed(v: number): string {
  const r = Math.round(v * 1e4) / 1e4;
  return r < 0 ? String(r) : `+${r === 0 ? 0 : r}`;
}

/** One line for the Temporal UI: `+0.1 valid, +0.2 new state, +0.3 gomail.compose_opened = 0.6`. */
export function summarizeBreakdown(b: RewardBreakdown): string {
  const terms = b !== null && typeof b === 'object' && Array.isArray(b.terms) ? b.terms : [];
  const parts = terms
    .filter((t) => t !== null && typeof t === 'object' && typeof t.value === 'number')
    .map((t) => {
      const term = typeof t.term === 'string' ? t.term : '?';
      const label = LABELS[term] ?? (term.startsWith('milestone:') ? term.slice('milestone:'.length) : term);
      return `${signed(t.value)} ${label}`;
    });
  const total = b !== null && typeof b === 'object' && typeof b.total === 'number' ? b.total : 0;
  const t = Math.round(total * 1e4) / 1e4;
  return `${parts.length ? parts.join(', ') : 'no terms'} = ${t === 0 ? 0 : t}`;
}
