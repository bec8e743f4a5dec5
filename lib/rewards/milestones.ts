// Building blocks for per-site milestone detectors: an accessibility-tree line parser, a URL splitter and
// bounded, type-checked readers for a site's persisted client state (the JSON REAL's `/finish` renders).
//
// Pure code: no I/O, no Node APIs, no clock, no randomness; it may run inside Temporal workflow code.
// Everything here tolerates garbage (null, numbers, cyclic objects, huge strings) and never throws.

import type { RewardView } from './types';

// ---------------------------------------------------------------------------------------------------------
// Detector contract

export interface MilestoneDetector {
  /** Milestone name, e.g. `compose_opened`; the reward term is `milestone:<site>.<name>`. */
  name: string;
  /** One line saying what evidence the detector relies on (shown in docs and tests). */
  evidence: string;
  /**
   * Evidence line when the milestone's evidence is present in `view` (the page after the action), else null.
   * `prev` is the page the action was taken in; a few detectors compare the two. Never throws.
   */
  detect(view: RewardView, prev: RewardView): string | null;
}

const MAX_EVIDENCE_CHARS = 200;

/** Wraps a detector body so that it can never throw and always returns one short line (or null). */
export function defineDetector(name: string, evidence: string, body: (view: Page, prev: Page) => string | null | undefined): MilestoneDetector {
  return {
    name,
    evidence,
    detect(view: RewardView, prev: RewardView): string | null {
      try {
        const out = body(pageOf(view), pageOf(prev));
        return typeof out === 'string' && out.length > 0 ? oneLine(out, MAX_EVIDENCE_CHARS) : null;
      } catch {
        return null;
      }
    },
  };
}

export function oneLine(s: string, max: number): string {
  const flat = s.replace(/\s+/g, ' ').trim();
  return flat.length <= max ? flat : flat.slice(0, max - 1) + '…';
}

// ---------------------------------------------------------------------------------------------------------
// Accessibility-tree lines: `[id] role "name" [extras like value="..." checked focused] @(x,y)`

export interface AxNode {
  id: number;
  role: string;
  /** Accessible name ('' when the line has none). */
  name: string;
  /** `value="..."` when present (text fields, selects, sliders), else null. */
  value: string | null;
  /** Other `key=value` extras (`options`, `type`, `fill`), values unquoted. */
  props: Record<string, string>;
  /** Bare extras: checked, unchecked, selected, expanded, collapsed, disabled, focused, password... */
  flags: string[];
  x: number | null;
  y: number | null;
  line: string;
}

/** Longer lines are cut before parsing (linear-time parsing of hostile input). */
const MAX_LINE_CHARS = 4000;
/** At most this much of an accessibility tree is read (the real ones are about 8 KB). */
const MAX_AXTREE_CHARS = 400_000;
const MAX_AX_LINES = 5000;

const COORD_SUFFIX = /\s@\((-?\d+),(-?\d+)\)\s*$/;

/** Reads one quoted token at `i` (double quotes with JSON escapes, or single quotes); null if none. */
function readQuoted(s: string, i: number): { text: string; end: number } | null {
  const q = s[i];
  if (q !== '"' && q !== "'") return null;
  let j = i + 1;
  while (j < s.length) {
    const c = s[j];
    if (c === '\\') {
      j += 2;
      continue;
    }
    if (c === q) break;
    j++;
  }
  if (j >= s.length) return null;
  const raw = s.slice(i, j + 1);
  let text: string;
  if (q === '"') {
    try {
      const parsed: unknown = JSON.parse(raw);
      text = typeof parsed === 'string' ? parsed : raw.slice(1, -1);
    } catch {
      text = raw.slice(1, -1);
    }
  } else {
    text = raw.slice(1, -1).replace(/\\(.)/g, '$1');
  }
  return { text, end: j + 1 };
}

/** Parses one accessibility-tree line; null for anything else (the `… N more` footer, blank lines). */
export function parseAxLine(input: unknown): AxNode | null {
  if (typeof input !== 'string') return null;
  const line = input.length > MAX_LINE_CHARS ? input.slice(0, MAX_LINE_CHARS) : input;
  const head = /^\s*\[(\d{1,9})\]\s+([A-Za-z][\w-]*)/.exec(line);
  if (!head) return null;
  let rest = line.slice(head[0].length);
  let x: number | null = null;
  let y: number | null = null;
  const coord = COORD_SUFFIX.exec(rest);
  if (coord) {
    x = Number(coord[1]);
    y = Number(coord[2]);
    rest = rest.slice(0, coord.index);
  }
  let name = '';
  let i = 0;
  while (i < rest.length && rest[i] === ' ') i++;
  const quoted = readQuoted(rest, i);
  if (quoted) {
    name = quoted.text;
    i = quoted.end;
  }
  let value: string | null = null;
  const props: Record<string, string> = {};
  const flags: string[] = [];
  while (i < rest.length) {
    while (i < rest.length && rest[i] === ' ') i++;
    if (i >= rest.length) break;
    const key = /^([A-Za-z][\w-]*)=/.exec(rest.slice(i, i + 64));
    if (key) {
      i += key[0].length;
      const q = readQuoted(rest, i);
      let v: string;
      if (q) {
        v = q.text;
        i = q.end;
      } else {
        let j = i;
        while (j < rest.length && rest[j] !== ' ') j++;
        v = rest.slice(i, j);
        i = j;
      }
      if (key[1] === 'value') value = v;
      else props[key[1]] = v;
      continue;
    }
    let j = i;
    while (j < rest.length && rest[j] !== ' ') j++;
    const word = rest.slice(i, j);
    if (/^[A-Za-z][\w-]*$/.test(word)) flags.push(word);
    i = j;
  }
  return { id: Number(head[1]), role: head[2].toLowerCase(), name, value, props, flags, x, y, line };
}

/** Parses an accessibility tree (bounded in size); unparseable lines are skipped. */
export function parseAxtree(text: unknown): AxNode[] {
  if (typeof text !== 'string' || text.length === 0) return [];
  const src = text.length > MAX_AXTREE_CHARS ? text.slice(0, MAX_AXTREE_CHARS) : text;
  const out: AxNode[] = [];
  let start = 0;
  let lines = 0;
  while (start <= src.length && lines < MAX_AX_LINES) {
    let end = src.indexOf('\n', start);
    if (end < 0) end = src.length;
    const node = parseAxLine(src.slice(start, end));
    if (node) out.push(node);
    lines++;
    start = end + 1;
  }
  return out;
}

export function hasFlag(n: AxNode, flag: string): boolean {
  return n.flags.includes(flag);
}

/** The node as a short quoted line for evidence: `[12] button "Send"`. */
export function describeNode(n: AxNode): string {
  let s = `[${n.id}] ${n.role}`;
  if (n.name) s += ' ' + JSON.stringify(oneLine(n.name, 60));
  if (n.value !== null) s += ` value=${JSON.stringify(oneLine(n.value, 60))}`;
  for (const f of n.flags) if (f !== 'focused') s += ' ' + f;
  return s;
}

/** Roles of controls that hold text the user types or picks. */
export const FIELD_ROLES: ReadonlySet<string> = new Set(['textbox', 'searchbox', 'combobox', 'spinbutton', 'listbox', 'textarea']);
/** Roles of passive text that can carry a page title, a banner or a toast. */
export const MESSAGE_ROLES: ReadonlySet<string> = new Set(['alert', 'status', 'alertdialog', 'log', 'text', 'heading', 'paragraph', 'note']);

export function isEnabled(n: AxNode): boolean {
  return !hasFlag(n, 'disabled');
}

export function nonEmpty(s: string | null | undefined): boolean {
  return typeof s === 'string' && s.trim().length > 0;
}

// ---------------------------------------------------------------------------------------------------------
// URLs (hand-rolled: no URL class needed, works on any string)

export interface UrlParts {
  scheme: string;
  /** Lower-cased `scheme://host[:port]`, '' for URLs without an authority (data:, about:). */
  origin: string;
  path: string;
  /** Query parameters in order, decoded ('+' as space); keys as written. */
  query: Array<[string, string]>;
  hash: string;
}

function decode(s: string): string {
  try {
    return decodeURIComponent(s.replace(/\+/g, ' '));
  } catch {
    return s;
  }
}

export function splitUrl(input: unknown): UrlParts {
  const url = typeof input === 'string' ? input.slice(0, 8192) : '';
  const m = /^([A-Za-z][A-Za-z0-9+.-]*):(\/\/([^/?#]*))?([^?#]*)(\?[^#]*)?(#.*)?$/.exec(url);
  if (!m) return { scheme: '', origin: '', path: '', query: [], hash: '' };
  const scheme = m[1].toLowerCase();
  const origin = m[2] !== undefined ? `${scheme}://${(m[3] ?? '').toLowerCase()}` : '';
  const query: Array<[string, string]> = [];
  const rawQuery = (m[5] ?? '').slice(1);
  if (rawQuery) {
    for (const part of rawQuery.split('&').slice(0, 100)) {
      if (!part) continue;
      const eq = part.indexOf('=');
      query.push(eq < 0 ? [decode(part), ''] : [decode(part.slice(0, eq)), decode(part.slice(eq + 1))]);
    }
  }
  return { scheme, origin, path: m[4] || (origin ? '/' : ''), query, hash: m[6] ?? '' };
}

// ---------------------------------------------------------------------------------------------------------
// A parsed view, cached per view object (detectors of one step share it)

export interface Page {
  url: string;
  parts: UrlParts;
  /** http(s) page: UI evidence (URL, accessibility tree) only counts there, never on data:/about:/file: pages
   *  the agent could write itself with `goto`, nor on the harness pages /finish and /config. */
  web: boolean;
  nodes: AxNode[];
  /** The client state (REAL `/finish` JSON) or undefined. */
  state: unknown;
}

// Keyed by the view object; reused only while its url, axtree and clientState are the same values.
const pageCache = new WeakMap<object, { url: unknown; axtree: unknown; state: unknown; page: Page }>();

export function pageOf(view: unknown): Page {
  let url: unknown = '';
  let axtree: unknown = '';
  let state: unknown;
  const isObj = view !== null && typeof view === 'object';
  try {
    if (isObj) {
      const v = view as Record<string, unknown>;
      url = v.url;
      axtree = v.axtree;
      state = v.clientState;
    }
  } catch {
    // A hostile object (throwing getters): treat as empty.
  }
  if (isObj) {
    const hit = pageCache.get(view);
    if (hit && hit.url === url && hit.axtree === axtree && hit.state === state) return hit.page;
  }
  const u = typeof url === 'string' ? url : '';
  const parts = splitUrl(u);
  const web = (parts.scheme === 'http' || parts.scheme === 'https') && !/^\/(finish|config)\/?$/i.test(parts.path);
  const page: Page = { url: u.slice(0, 2048), parts, web, nodes: web ? parseAxtree(axtree) : [], state };
  if (isObj) pageCache.set(view, { url, axtree, state, page });
  return page;
}

/** First node matching `pred`, or undefined. */
export function findNode(p: Page, pred: (n: AxNode) => boolean): AxNode | undefined {
  for (const n of p.nodes) if (pred(n)) return n;
  return undefined;
}

/** `url <path>` evidence when the page is a web page and its path matches. */
export function pathEvidence(p: Page, re: RegExp): string | null {
  if (!p.web) return null;
  return re.test(p.parts.path) ? `url path ${oneLine(p.parts.path, 100)}` : null;
}

/** `url ?key=value` evidence for the first query parameter whose key matches and whose value is meaningful. */
export function queryEvidence(p: Page, key: RegExp, value: (v: string) => boolean = nonEmpty): string | null {
  if (!p.web) return null;
  for (const [k, v] of p.parts.query) if (key.test(k) && value(v)) return `url ?${oneLine(k, 40)}=${oneLine(v, 60)}`;
  return null;
}

// ---------------------------------------------------------------------------------------------------------
// Client state (REAL `/finish` JSON: `initialfinaldiff.{added,updated,deleted}`, `differences.<collection>`)

export function isRecord(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

/** Reads `obj[k1][k2]...` through plain objects (and arrays by index); undefined on any mismatch. */
export function getPath(obj: unknown, path: readonly string[]): unknown {
  let cur: unknown = obj;
  for (const k of path) {
    if (cur === null || typeof cur !== 'object') return undefined;
    try {
      if (!Object.hasOwn(cur, k)) return undefined;
      cur = (cur as Record<string, unknown>)[k];
    } catch {
      return undefined;
    }
  }
  return cur;
}

const MAX_COLLECTION = 2000;

/** Items of a collection stored either as a list or as an id → item object; [] for anything else. */
export function itemsOf(v: unknown): unknown[] {
  try {
    if (Array.isArray(v)) return v.slice(0, MAX_COLLECTION);
    if (isRecord(v)) return Object.values(v).slice(0, MAX_COLLECTION);
  } catch {
    // hostile object
  }
  return [];
}

/** Items at a path, records only. */
export function recordsAt(obj: unknown, path: readonly string[]): Array<Record<string, unknown>> {
  return itemsOf(getPath(obj, path)).filter(isRecord);
}

export function str(v: unknown): string {
  return typeof v === 'string' ? v : '';
}

/** A string, or the first non-empty string of a list (e.g. an email's `to`, which is a list or a string). */
export function strOrFirst(v: unknown): string {
  if (typeof v === 'string') return v;
  if (Array.isArray(v)) {
    for (const x of v.slice(0, 50)) if (typeof x === 'string' && x.trim()) return x;
  }
  return '';
}

export interface WalkEntry {
  /** Keys from the walk's root, e.g. ['filter', 'maxPrice']. */
  path: string[];
  key: string;
  value: unknown;
}

const MAX_WALK_NODES = 20_000;
const MAX_WALK_DEPTH = 12;

/**
 * Depth-first walk over plain objects and arrays, bounded in nodes and depth (safe on cycles and on the
 * ~400 KB `/finish` captures). `visit` returns a string to stop the walk with that result.
 */
export function walk(root: unknown, visit: (e: WalkEntry) => string | null | undefined, skipTop: readonly string[] = []): string | null {
  const stack: Array<{ value: unknown; path: string[] }> = [{ value: root, path: [] }];
  let seen = 0;
  while (stack.length > 0) {
    const { value, path } = stack.pop()!;
    if (value === null || typeof value !== 'object' || path.length >= MAX_WALK_DEPTH) continue;
    let entries: Array<[string, unknown]>;
    try {
      entries = Array.isArray(value) ? value.slice(0, MAX_COLLECTION).map((v, i) => [String(i), v]) : Object.entries(value).slice(0, MAX_COLLECTION);
    } catch {
      continue;
    }
    for (let i = entries.length - 1; i >= 0; i--) {
      const [key, child] = entries[i];
      if (path.length === 0 && skipTop.includes(key)) continue;
      if (++seen > MAX_WALK_NODES) return null;
      const childPath = [...path, key];
      const hit = visit({ path: childPath, key, value: child });
      if (typeof hit === 'string' && hit) return hit;
      if (child !== null && typeof child === 'object') stack.push({ value: child, path: childPath });
    }
  }
  return null;
}

/** The state's `initialfinaldiff.added` and `.updated` subtrees (what the episode changed), with their names. */
export function changedSubtrees(state: unknown): Array<{ section: 'added' | 'updated'; tree: Record<string, unknown> }> {
  const out: Array<{ section: 'added' | 'updated'; tree: Record<string, unknown> }> = [];
  for (const section of ['added', 'updated'] as const) {
    const tree = getPath(state, ['initialfinaldiff', section]);
    if (isRecord(tree)) out.push({ section, tree });
  }
  return out;
}

/** `router.location.pathname` from the state diff (the page the app was on when the state was read). */
export function routerPath(state: unknown): string {
  for (const { tree } of changedSubtrees(state)) {
    const p = getPath(tree, ['router', 'location', 'pathname']);
    if (typeof p === 'string') return p;
  }
  return '';
}

/** A value that records a real choice: non-empty text other than "any", a non-zero number, true, a non-empty list. */
export function meaningful(v: unknown): boolean {
  if (typeof v === 'string') {
    const t = v.trim().toLowerCase();
    return t.length > 0 && !/^(any|all|none|null|undefined|no min|no max|no_min|no_max|0|\$0|-)$/.test(t);
  }
  if (typeof v === 'number') return Number.isFinite(v) && v !== 0;
  if (typeof v === 'boolean') return v;
  if (Array.isArray(v)) return v.length > 0;
  return false;
}

export function quote(v: unknown): string {
  if (typeof v === 'string') return JSON.stringify(oneLine(v, 60));
  if (typeof v === 'number' || typeof v === 'boolean') return String(v);
  if (Array.isArray(v)) return `[${v.length} items]`;
  return typeof v;
}
