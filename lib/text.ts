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
