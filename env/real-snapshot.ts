import { isDeepStrictEqual } from 'node:util';
import type { BrowserContext, Page } from 'playwright-core';

/**
 * A REAL session's client state, enough to open a copy of it without replaying its actions: the clone sites
 * keep their state in the browser (redux-persist in localStorage, some in sessionStorage or cookies), so a
 * new context seeded with that storage and opened at the same URL is the same episode state. A copy is checked
 * on /finish (what the eval reads, rendered from a copy of the storage, env/real-state-copy.ts) and on the page the
 * policy saw: state held only in page scripts reaches neither storage nor that read, but it shows on the page.
 */
export interface ClientSnapshot {
  /** Playwright's storageState: cookies and per-origin localStorage. */
  storage: Awaited<ReturnType<BrowserContext['storageState']>>;
  /** The agent tab's sessionStorage (Playwright's storageState leaves it out). */
  sessionStorage: Record<string, string>;
  url: string;
  /** Actions the episode has taken (the step counter the fork continues from). */
  steps: number;
  /** The /finish JSON text when the snapshot was taken: the fork must render the same. */
  finish: string;
  /** The accessibility tree the policy last saw there (a fork's parent): the fork's page must read the same. */
  view?: string;
}

export async function readSessionStorage(page: Page): Promise<Record<string, string>> {
  return page.evaluate(() => {
    const out: Record<string, string> = {};
    for (let i = 0; i < sessionStorage.length; i++) {
      const k = sessionStorage.key(i);
      if (k !== null) out[k] = sessionStorage.getItem(k) ?? '';
    }
    return out;
  });
}

/**
 * Writes the entries back into a tab's sessionStorage before the site's scripts read it. Registered on the
 * agent page only for its first navigation: on a later one it would undo what the site wrote since.
 */
export function restoreSessionStorage(arg: { origin: string; entries: Record<string, string> }): void {
  if (location.origin !== arg.origin) return;
  for (const [k, v] of Object.entries(arg.entries)) sessionStorage.setItem(k, v);
}

/** Equal /finish states, compared as JSON values (key order and whitespace do not matter to an eval). */
export function sameFinalState(a: string, b: string): boolean {
  try {
    return isDeepStrictEqual(JSON.parse(a), JSON.parse(b));
  } catch {
    return a === b;
  }
}

/**
 * The same page for a fork: equal accessibility trees but for element ids, grid positions and focus, which a
 * fresh page numbers, lays out and focuses anew (a copy restores neither the parent's renders nor its caret).
 */
export function sameView(a: string, b: string): boolean {
  const plain = (t: string) =>
    t
      .split('\n')
      .map((l) =>
        l
          .replace(/^\s*\[\d+\] /, '')
          .replace(/ @\(\d+,\d+\)$/, '')
          .replace(/ focused\b/, ''),
      )
      .join('\n');
  return plain(a) === plain(b);
}

/** How a start that asked for a fork got its state. */
export type ForkKind = 'snapshot' | 'replay-fallback';

/** Worker-wide fork counters (also reported per start in StartSessionResult.fork). */
export interface ForkCounters {
  fork_snapshots: number;
  fork_replay_fallbacks: number;
}
