// Evaluation statistics: pure functions, safe in workflow code (no I/O, no Node APIs, no clocks).

import { MINIWOB_RAISED_TIME_LIMIT_MS, type MiniwobConfig } from '../config/config';

/** One evaluated episode, as small as it can be (the trajectory stays in the blob store). */
export interface EvalEpisodeRecord {
  /** The mode's label (its `name` unless the config gives a `label`). */
  mode: string;
  task: string;
  /** REAL site (`gomail`, …) or `miniwob`. */
  site: string;
  seed: number;
  workflowId: string;
  success: boolean;
  /** The environment's own reward. */
  reward: number;
  /** Sum of the shaped (dense) step rewards. */
  shapedReturn: number;
  steps: number;
  validActions: number;
  actionValidity: number;
  done: boolean;
  reason: string | null;
  trajectoryRef?: string;
  /** Set when the episode workflow failed (counted as a failure in `n`, left out of the other statistics). */
  error?: string;
  /** Steps sampled without token ids (a served mode whose server gives none); absent when every step had them. */
  tokenIdsMissing?: number;
  /** REAL: how the episode was judged (`real.scoring`); absent for MiniWoB++ and for records written before it was kept. */
  scoring?: 'official' | 'training';
}

export interface WilsonInterval {
  low: number;
  high: number;
}

export interface EvalSummaryRow {
  mode: string;
  /** A REAL site, `miniwob`, or `all` (every site of the mode; only when the mode has more than one). */
  site: string;
  n: number;
  successes: number;
  /** Episodes whose workflow failed: counted in n as failures. */
  errors: number;
  successRate: number;
  /** 95% Wilson score interval of the success rate. */
  ci95: WilsonInterval;
  /** Over the episodes that finished (no error); null when none did. */
  medianSteps: number | null;
  meanReward: number | null;
  meanShapedReturn: number | null;
  /** Valid actions / all actions of the finished episodes (pooled, like the training metrics); null without steps. */
  actionValidity: number | null;
}

export interface EvalSkip {
  mode: string;
  reason: string;
}

export interface EvalNote {
  mode: string;
  note: string;
}

export interface EvalSummary {
  evalId: string;
  env: 'miniwob' | 'real';
  /** Mode labels in config order (skipped ones excluded). */
  modes: string[];
  rows: EvalSummaryRow[];
  skipped: EvalSkip[];
  notes: EvalNote[];
  /** What each mode evaluated (model, adapter), when known. */
  modeDetails?: { mode: string; describe: string }[];
  /** REAL: the scoring every episode was judged under (the records' `scoring`); absent for MiniWoB++. */
  scoring?: 'official' | 'training';
}

/**
 * How MiniWoB++ episodes were run and scored, for the summary's notes: a success rate is comparable with
 * published MiniWoB++ numbers only under `timeLimit: official` (and, for mean reward, `reward: official`).
 */
export function miniwobSettingsNote(settings: Partial<MiniwobConfig>): EvalNote {
  const limit = settings.timeLimit ?? 'raised';
  const time =
    limit === 'official'
      ? "time limit official (each task's own, 10 s unless the task sets 7-30 s)"
      : limit === 'raised'
        ? `time limit raised (${MINIWOB_RAISED_TIME_LIMIT_MS} ms for every task, not the official limits)`
        : `time limit ${limit} ms for every task (not the official limits)`;
  const reward = settings.reward === 'official' ? 'reward official (time-scaled)' : 'reward raw (no time penalty)';
  return { mode: '*', note: `MiniWoB++ settings: ${time}; ${reward}; success = raw reward 1 (partial credit is a failure)` };
}

/**
 * How REAL episodes were judged, for the summary's notes: only `official` numbers are comparable with agisdk's
 * (and the benchmark's); `training` ones were read more leniently and can count successes agisdk scores 0.
 */
export function realScoringNote(scoring: 'official' | 'training'): EvalNote {
  const how =
    scoring === 'official'
      ? "official (agisdk 0.3.5's harness rules: one /finish read at the end with its 1 s budgets and no retry, dialogs dismissed, typing replaces a field's value, its action timeouts, no state copies; an unscorable task is run and counts as a failure)"
      : 'training (lenient: /finish polled up to 10 s, dialogs accepted, typing appends; not comparable with agisdk or the benchmark)';
  return { mode: '*', note: `REAL scoring: ${how}; results are local (nothing is submitted to the REAL leaderboard)` };
}

/** z for a two-sided 95% interval. */
export const Z95 = 1.959963984540054;

/**
 * Wilson score interval for `successes` out of `n`:
 * centre = (p + z²/2n) / (1 + z²/n), half-width = z / (1 + z²/n) · sqrt(p(1-p)/n + z²/4n²).
 * n = 0 carries no information: [0, 1].
 */
export function wilsonInterval(successes: number, n: number, z = Z95): WilsonInterval {
  if (!(n > 0)) return { low: 0, high: 1 };
  if (successes < 0 || successes > n) throw new RangeError(`successes ${successes} not in [0, ${n}]`);
  const p = successes / n;
  const z2 = z * z;
  const denom = 1 + z2 / n;
  const centre = (p + z2 / (2 * n)) / denom;
  const half = (z / denom) * Math.sqrt((p * (1 - p)) / n + z2 / (4 * n * n));
  // Clamp the rounding noise at the edges (0/n gives exactly 0, n/n exactly 1).
  return { low: successes === 0 ? 0 : Math.max(0, centre - half), high: successes === n ? 1 : Math.min(1, centre + half) };
}

/** Median of a list (mean of the middle two for an even count); null for an empty list. */
export function median(values: readonly number[]): number | null {
  if (values.length === 0) return null;
  const s = [...values].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return s.length % 2 === 1 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
}

function mean(values: readonly number[]): number | null {
  return values.length === 0 ? null : values.reduce((a, b) => a + b, 0) / values.length;
}

function round(x: number | null, digits = 6): number | null {
  if (x === null) return null;
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

/** Statistics of one group of episodes. */
export function summarizeGroup(mode: string, site: string, episodes: readonly EvalEpisodeRecord[]): EvalSummaryRow {
  const n = episodes.length;
  const successes = episodes.filter((e) => e.success && !e.error).length;
  const finished = episodes.filter((e) => !e.error);
  const steps = finished.reduce((s, e) => s + e.steps, 0);
  const valid = finished.reduce((s, e) => s + e.validActions, 0);
  const ci = wilsonInterval(successes, n);
  return {
    mode,
    site,
    n,
    successes,
    errors: n - finished.length,
    successRate: n === 0 ? 0 : round(successes / n)!,
    ci95: { low: round(ci.low)!, high: round(ci.high)! },
    medianSteps: median(finished.map((e) => e.steps)),
    meanReward: round(mean(finished.map((e) => e.reward))),
    meanShapedReturn: round(mean(finished.map((e) => e.shapedReturn))),
    actionValidity: steps === 0 ? null : round(valid / steps),
  };
}

/**
 * Rows per mode (in `modes` order, then any mode only the episodes name) and site (sorted), plus an `all`
 * row per mode that spans more than one site.
 */
export function summarizeEval(input: {
  evalId: string;
  env: 'miniwob' | 'real';
  modes: readonly string[];
  episodes: readonly EvalEpisodeRecord[];
  skipped?: readonly EvalSkip[];
  notes?: readonly EvalNote[];
  modeDetails?: readonly { mode: string; describe: string }[];
}): EvalSummary {
  const order = [...input.modes];
  for (const e of input.episodes) if (!order.includes(e.mode)) order.push(e.mode);
  const rows: EvalSummaryRow[] = [];
  for (const mode of order) {
    const mine = input.episodes.filter((e) => e.mode === mode);
    const sites = [...new Set(mine.map((e) => e.site))].sort();
    for (const site of sites)
      rows.push(
        summarizeGroup(
          mode,
          site,
          mine.filter((e) => e.site === site),
        ),
      );
    if (sites.length > 1) rows.push(summarizeGroup(mode, 'all', mine));
  }
  return {
    evalId: input.evalId,
    env: input.env,
    modes: order,
    rows,
    skipped: [...(input.skipped ?? [])],
    notes: [...(input.notes ?? [])],
    ...(input.modeDetails ? { modeDetails: [...input.modeDetails] } : {}),
    ...scoringOf(input.episodes),
  };
}

/** The one scoring of the records; a mix would make the rows incomparable, so it is an error. */
function scoringOf(episodes: readonly EvalEpisodeRecord[]): Pick<EvalSummary, 'scoring'> {
  const seen = [...new Set(episodes.flatMap((e) => (e.scoring ? [e.scoring] : [])))];
  if (seen.length > 1) throw new Error(`evaluation records mix REAL scorings (${seen.join(', ')}): one summary is one scoring`);
  return seen.length === 1 ? { scoring: seen[0] } : {};
}

const pct = (x: number) => `${(x * 100).toFixed(1)}%`;
const fixed = (x: number | null, digits: number) => (x === null ? '–' : x.toFixed(digits));

/** `50.0% (23.7–76.3%)`: the success rate with its 95% Wilson interval. */
export function formatSuccess(row: Pick<EvalSummaryRow, 'successRate' | 'ci95'>): string {
  return `${pct(row.successRate)} (${(row.ci95.low * 100).toFixed(1)}–${pct(row.ci95.high)})`;
}

/** Markdown pipes and newlines inside a cell would break the table. */
const cell = (s: string) => s.replace(/\|/g, '\\|').replace(/\s*\n\s*/g, ' ');

/** The summary as Markdown: one table (mode | site | n | success (95% CI) | median steps | mean reward | validity), then skipped modes and notes. */
export function summaryMarkdown(summary: EvalSummary): string {
  const lines: string[] = [`## Evaluation ${summary.evalId} (${summary.env}${summary.scoring ? `, ${summary.scoring} scoring` : ''})`, ''];
  if (summary.rows.length === 0) {
    lines.push('No episodes were run.', '');
  } else {
    lines.push('| mode | site | n | success (95% CI) | median steps | mean reward | validity |');
    lines.push('|---|---|---:|---|---:|---:|---:|');
    for (const r of summary.rows) {
      const n = r.errors > 0 ? `${r.n} (${r.errors} failed)` : `${r.n}`;
      const validity = r.actionValidity === null ? '–' : pct(r.actionValidity);
      lines.push(`| ${cell(r.mode)} | ${cell(r.site)} | ${n} | ${formatSuccess(r)} | ${fixed(r.medianSteps, 1)} | ${fixed(r.meanReward, 3)} | ${validity} |`);
    }
    lines.push('');
  }
  if (summary.modeDetails?.length) {
    lines.push('### Modes', '');
    for (const m of summary.modeDetails) lines.push(`- ${cell(m.mode)}: ${cell(m.describe)}`);
    lines.push('');
  }
  lines.push('### Skipped', '');
  if (summary.skipped.length === 0) lines.push('None.');
  for (const s of summary.skipped) lines.push(`- ${cell(s.mode)}: ${cell(s.reason)}`);
  lines.push('');
  if (summary.notes.length > 0) {
    lines.push('### Notes', '');
    for (const n of summary.notes) lines.push(`- ${cell(n.mode)}: ${cell(n.note)}`);
    lines.push('');
  }
  return lines.join('\n');
}

/** The summary as pretty JSON (what `summary.json` holds). */
export function summaryJson(summary: EvalSummary): string {
  return JSON.stringify(summary, null, 2) + '\n';
}
