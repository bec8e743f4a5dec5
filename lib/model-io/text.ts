// Small text helpers shared by the model-output parsers and the task registries. Pure: safe in workflow code.

/** "```json\n...\n```" -> "...". Done by hand: a lazy regex anchored at both ends can backtrack quadratically. */
export function stripCodeFence(text: string): string {
  if (text.length < 6 || !text.startsWith('```') || !text.endsWith('```')) return text;
  const firstNewline = text.indexOf('\n');
  if (firstNewline === -1 || firstNewline > text.length - 3) return text;
  return text.slice(firstNewline + 1, text.length - 3).trim();
}

/**
 * Index just past the `}` matching the `{` at `start`, or -1 if the text ends first.
 * String-aware (braces inside "..." and escaped quotes do not count), which a regex cannot do.
 */
export function matchingBrace(text: string, start: number): number {
  let depth = 0;
  let inString = false;
  for (let i = start; i < text.length; i++) {
    const c = text[i];
    if (inString) {
      if (c === '\\') i++;
      else if (c === '"') inString = false;
    } else if (c === '"') {
      inString = true;
    } else if (c === '{') {
      depth++;
    } else if (c === '}') {
      depth--;
      if (depth === 0) return i + 1;
    }
  }
  return -1;
}

/** Levenshtein distance (one row of the table), for "did you mean" suggestions. */
export function editDistance(a: string, b: string): number {
  const prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    let diag = prev[0];
    prev[0] = i;
    for (let j = 1; j <= b.length; j++) {
      const up = prev[j];
      prev[j] = Math.min(prev[j] + 1, prev[j - 1] + 1, diag + (a[i - 1] === b[j - 1] ? 0 : 1));
      diag = up;
    }
  }
  return prev[b.length];
}

/** The longest page URL an activity summary carries (query and fragment are dropped first). */
export const SUMMARY_URL_CHARS = 80;
/** Activity summaries are Temporal user metadata, kept small by the server: at most this many UTF-8 bytes. */
export const SUMMARY_MAX_BYTES = 240;

function utf8Bytes(s: string): number {
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x80) n += 1;
    else if (c < 0x800) n += 2;
    else if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length) {
      n += 4;
      i++;
    } else n += 3;
  }
  return n;
}

/** A URL for a one-line summary: no query or fragment (they may carry tokens), at most SUMMARY_URL_CHARS. */
export function clipUrlForSummary(url: string): string {
  const cut = url.search(/[?#]/);
  const bare = cut === -1 ? url : `${url.slice(0, cut)}${url[cut]}…`;
  return bare.length <= SUMMARY_URL_CHARS ? bare : `${bare.slice(0, SUMMARY_URL_CHARS - 1)}…`;
}

/**
 * An activity summary as it is scheduled: every URL in it clipped (clipUrlForSummary), one line, and the
 * whole at most SUMMARY_MAX_BYTES bytes, so a page with a long URL cannot make the command too large.
 */
export function clipSummary(summary: string): string {
  let s = summary.replace(/\s*[\r\n]+\s*/g, ' ').replace(/\b(?:[a-z][a-z0-9+.-]*:\/\/|data:)\S+/gi, clipUrlForSummary);
  if (utf8Bytes(s) <= SUMMARY_MAX_BYTES) return s;
  const chars = Array.from(s);
  while (chars.length > 0 && utf8Bytes(chars.join('')) > SUMMARY_MAX_BYTES - 3) chars.pop();
  s = `${chars.join('')}…`;
  return s;
}
