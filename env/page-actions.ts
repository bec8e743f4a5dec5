import type { CDPSession, Page } from 'playwright-core';
import { GRID_MAX, type Action } from '../lib/model-io/actions';
import { PAGE_SCRIPT, type AxTreeOptions, type PageView } from './page-scripts';

/**
 * Page-level pieces shared by the environment adapters (MiniWoB++, REAL): key-name mapping, the execution
 * of every non-terminal, non-navigating action, the screenshot capture and the accessibility-tree read.
 * An adapter owns the episode logic (rewards, `answer`, `goto` policy); everything that only touches the
 * page lives here.
 */

/** How the 0-1000 grid maps onto the page: the screenshot shows `viewport / zoom` CSS px rendered at `zoom`. */
export interface PageGeometry {
  zoom: number;
  viewport: { width: number; height: number };
}

/** Actions executed by executePageAction: all but the terminal `answer` and `goto` (each adapter has its own rule). */
export type PageAction = Exclude<Action, { type: 'answer' } | { type: 'goto' }>;

/**
 * How long an element action (click_element, type into an element) waits for Playwright's actionability checks
 * and the click itself. These take a few animation frames of the page's renderer, so they slow down with the
 * machine's load, not with the page: 32 forked MiniWoB++ pages on 2 cores need up to 6 s for a click on a
 * visible, enabled button. A tighter limit scores a right action as rejected (and a click that did land as
 * both rejected and successful), which is noise in exactly the rewards a run learns from.
 */
export const ELEMENT_ACTION_TIMEOUT_MS = 20_000;

const MODIFIERS: Record<string, string> = {
  ctrl: 'Control',
  control: 'Control',
  shift: 'Shift',
  alt: 'Alt',
  option: 'Alt',
  meta: 'Meta',
  cmd: 'Meta',
  command: 'Meta',
  super: 'Meta',
  win: 'Meta',
  windows: 'Meta',
};

const NAMED_KEYS: Record<string, string> = {
  enter: 'Enter',
  return: 'Enter',
  tab: 'Tab',
  esc: 'Escape',
  escape: 'Escape',
  backspace: 'Backspace',
  delete: 'Delete',
  del: 'Delete',
  insert: 'Insert',
  ins: 'Insert',
  up: 'ArrowUp',
  down: 'ArrowDown',
  left: 'ArrowLeft',
  right: 'ArrowRight',
  arrowup: 'ArrowUp',
  arrowdown: 'ArrowDown',
  arrowleft: 'ArrowLeft',
  arrowright: 'ArrowRight',
  space: 'Space',
  spacebar: 'Space',
  pageup: 'PageUp',
  pagedown: 'PageDown',
  pgup: 'PageUp',
  pgdn: 'PageDown',
  home: 'Home',
  end: 'End',
  capslock: 'CapsLock',
};

/**
 * Maps policy key names (case-insensitive; "ctrl+a" inside one entry is split) to Playwright key names.
 * Single characters stay characters, except that with Control/Alt/Meta held a letter or digit becomes its
 * physical key (KeyA, Digit1), which is what Chromium's shortcuts (select all, copy, paste) listen to.
 * Returns `{ unknown }` with the first name it cannot map.
 */
export function toPlaywrightKeys(keys: readonly string[]): { keys: string[] } | { unknown: string } {
  const parts: string[] = [];
  for (const entry of keys) {
    if (entry.length > 1 && entry.includes('+')) {
      // "ctrl+a", "ctrl++" (control and plus), "shift+" (shift and plus)
      const trailingPlus = entry.endsWith('+');
      const body = trailingPlus ? entry.slice(0, -1) : entry;
      parts.push(...body.split('+').filter((p) => p !== ''));
      if (trailingPlus) parts.push('+');
    } else {
      parts.push(entry);
    }
  }
  const mapped: string[] = [];
  for (const raw of parts) {
    const p = raw.length === 1 ? raw : raw.trim();
    const lower = p.toLowerCase();
    let key: string | undefined;
    if (p.length === 1) key = p === ' ' ? 'Space' : p;
    else if (MODIFIERS[lower]) key = MODIFIERS[lower];
    else if (NAMED_KEYS[lower]) key = NAMED_KEYS[lower];
    else if (/^f([1-9]|1[0-2])$/.test(lower)) key = lower.toUpperCase();
    else if (/^(key[a-z]|digit[0-9])$/.test(lower)) key = lower.startsWith('key') ? `Key${lower[3].toUpperCase()}` : `Digit${lower[5]}`;
    if (key === undefined) return { unknown: raw };
    mapped.push(key);
  }
  const shortcut = mapped.some((k) => k === 'Control' || k === 'Alt' || k === 'Meta');
  if (shortcut) {
    for (let i = 0; i < mapped.length; i++) {
      const k = mapped[i];
      if (/^[a-zA-Z]$/.test(k)) mapped[i] = `Key${k.toUpperCase()}`;
      else if (/^[0-9]$/.test(k)) mapped[i] = `Digit${k}`;
    }
  }
  return { keys: mapped };
}

export function sleep(ms: number): Promise<void> {
  return new Promise((ok) => setTimeout(ok, ms));
}

/** First non-empty line of an error message, at most 300 characters. */
export function firstLine(err: unknown): string {
  const msg = err instanceof Error ? err.message : String(err);
  const line = msg.split('\n').find((l) => l.trim() !== '') ?? msg;
  return line.length > 300 ? `${line.slice(0, 299)}…` : line;
}

export const FATAL_PATTERNS =
  /Target crashed|Page crashed|Target page, context or browser has been closed|Browser has been closed|browser has disconnected|Target closed|Session closed|Connection closed/i;

/** Errors after which the page (or the browser) is gone: they must propagate, not become action errors. */
export function isFatalPageError(err: unknown): boolean {
  return FATAL_PATTERNS.test(err instanceof Error ? err.message : String(err));
}

/** Grid (0-1000 over the screenshot) to page CSS px. */
export function gridToPage(x: number, y: number, geom: PageGeometry): { x: number; y: number } {
  const { width, height } = geom.viewport;
  return { x: ((x / GRID_MAX) * width) / geom.zoom, y: ((y / GRID_MAX) * height) / geom.zoom };
}

export interface ExecuteOptions {
  /**
   * Element clicks skip Playwright's actionability checks (visible, stable for two frames, enabled, hit): for a
   * replay of actions that ran before, whose end state is checked against the one they reached.
   */
  force?: boolean;
  /**
   * `type` into an element replaces its value (Playwright's fill, agisdk's `fill(bid, value)`) instead of
   * clicking it and typing after what it holds.
   */
  fill?: boolean;
  /** Bound on one element action (default ELEMENT_ACTION_TIMEOUT_MS; agisdk uses 500 ms). */
  elementTimeoutMs?: number;
}

/**
 * Runs one action on the page. Returns an error text for actions that cannot run (no such element, unknown
 * key); Playwright errors are thrown (the caller turns non-fatal ones into action errors with firstLine).
 */
export async function executePageAction(page: Page, action: PageAction, geom: PageGeometry, opts: ExecuteOptions = {}): Promise<string | undefined> {
  const timeout = opts.elementTimeoutMs ?? ELEMENT_ACTION_TIMEOUT_MS;
  const click = { timeout, ...(opts.force ? { force: true } : {}) };
  switch (action.type) {
    case 'click': {
      const p = gridToPage(action.x, action.y, geom);
      await page.mouse.click(p.x, p.y, { button: action.button, clickCount: action.count });
      return undefined;
    }
    case 'double_click': {
      const p = gridToPage(action.x, action.y, geom);
      await page.mouse.dblclick(p.x, p.y);
      return undefined;
    }
    case 'move': {
      const p = gridToPage(action.x, action.y, geom);
      await page.mouse.move(p.x, p.y);
      return undefined;
    }
    case 'click_element': {
      const loc = page.locator(`[data-halo-id="${action.id}"]`);
      if ((await loc.count()) === 0) return `no element with id ${action.id}`;
      await loc.first().click(click);
      return undefined;
    }
    case 'type': {
      if (action.id !== undefined) {
        const loc = page.locator(`[data-halo-id="${action.id}"]`);
        if ((await loc.count()) === 0) return `no element with id ${action.id}`;
        const target = loc.first();
        const tag = (await target.evaluate('(el) => el.tagName', undefined, { timeout })) as string;
        if (tag === 'SELECT') {
          // A native <select> popup cannot be driven by keys in headless Chromium: pick the option by label.
          await target.selectOption({ label: action.text }, { timeout });
          return undefined;
        }
        if (opts.fill) {
          await target.fill(action.text, { timeout, ...(opts.force ? { force: true } : {}) });
          return undefined;
        }
        await target.click(click);
      }
      await page.keyboard.type(action.text);
      return undefined;
    }
    case 'key': {
      const mapped = toPlaywrightKeys(action.keys);
      if ('unknown' in mapped) return `unknown key ${JSON.stringify(mapped.unknown)}`;
      const held: string[] = [];
      try {
        for (const k of mapped.keys) {
          await page.keyboard.down(k);
          held.push(k);
        }
      } finally {
        for (const k of held.reverse()) await page.keyboard.up(k);
      }
      return undefined;
    }
    case 'scroll': {
      if (action.x !== undefined && action.y !== undefined) {
        const p = gridToPage(action.x, action.y, geom);
        await page.mouse.move(p.x, p.y);
      }
      // `amount` is in screenshot pixels, like the coordinates the policy sees.
      const d = action.amount / geom.zoom;
      const dx = action.direction === 'left' ? -d : action.direction === 'right' ? d : 0;
      const dy = action.direction === 'up' ? -d : action.direction === 'down' ? d : 0;
      await page.mouse.wheel(dx, dy);
      return undefined;
    }
    case 'wait':
      await sleep(action.seconds * 1000);
      return undefined;
  }
}

/** Captures tried before a capture failure is the step's error (each after two animation frames). */
const CAPTURE_ATTEMPTS = 3;

/**
 * PNG of the top-left (viewport / zoom) CSS px of the visual viewport at (scrollX, scrollY), rendered at `zoom`.
 * Right after a navigation the page may have no frame yet: Chromium answers "Unable to capture screenshot" (one in
 * seven first captures after `goto` in the headless shell, 2026-11-30). Two animation frames later it has one.
 */
export async function captureViewport(cdp: CDPSession, geom: PageGeometry, scrollX: number, scrollY: number): Promise<Buffer> {
  const { width, height } = geom.viewport;
  for (let attempt = 1; ; attempt++) {
    try {
      const res = (await cdp.send('Page.captureScreenshot', {
        format: 'png',
        fromSurface: true,
        captureBeyondViewport: false,
        clip: { x: scrollX, y: scrollY, width: width / geom.zoom, height: height / geom.zoom, scale: geom.zoom },
      })) as { data: string };
      return Buffer.from(res.data, 'base64');
    } catch (err) {
      if (attempt >= CAPTURE_ATTEMPTS || !/Unable to capture screenshot/.test(String((err as Error).message))) throw err;
      await cdp.send('Runtime.evaluate', { expression: 'new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))', awaitPromise: true });
    }
  }
}

/**
 * Installs the page script if this document does not have it yet (after a full navigation) and reads the
 * view: accessibility tree with `data-halo-id` ids and grid coordinates, plus the scroll offset.
 */
export async function readPageView(page: Page, opts: AxTreeOptions): Promise<PageView> {
  return (await page.evaluate(`(${PAGE_SCRIPT}, window.__halo.view(${JSON.stringify(opts)}))`)) as PageView;
}

/** Installs the page script if needed and gives ids to new elements (after an action). */
export async function assignPageIds(page: Page): Promise<void> {
  await page.evaluate(`(${PAGE_SCRIPT}, window.__halo.assignIds(), true)`);
}
