/**
 * A node:test reporter that writes one JSON line per test file: `{ file, tests, failed, seconds }`.
 *
 * `seconds` is the runner's own `test:complete` of the file (its process from start to exit, imports and servers
 * included), which per-test durations leave out. Used beside the spec reporter:
 * `node --test --test-reporter=spec --test-reporter-destination=stdout \
 *   --test-reporter=./test/reporters/file-durations.mjs --test-reporter-destination=FILE …`
 * (`tools/test_durations.py` sorts these lines with pytest's and prints the slowest). Plain JavaScript: Node 20
 * loads reporters before `--import tsx` is in place.
 */
import { relative } from 'node:path';

/** @param {AsyncIterable<{ type: string, data: { name?: string, file?: string, nesting?: number, details?: { duration_ms?: number, type?: string, passed?: boolean } } }>} source */
export default async function* fileDurations(source) {
  /** @type {Map<string, { tests: number, failed: number }>} */
  const tallies = new Map();
  const tally = (file) => {
    let t = tallies.get(file);
    if (!t) {
      t = { tests: 0, failed: 0 };
      tallies.set(file, t);
    }
    return t;
  };
  for await (const { type, data } of source) {
    // test:complete comes as each test ends, in every file at once; test:pass/fail come later, one file after
    // another, so only test:complete is counted: a file's own test:complete (named by its path) follows its tests'.
    if (type !== 'test:complete' || !data.file) continue;
    const file = data.file;
    const t = tally(file);
    if (data.name === file && data.nesting === 0) {
      // A file that failed outside any test (an import error, a non-zero exit) counts as one failure.
      if (data.details?.passed === false && t.failed === 0) t.failed = 1;
      const seconds = Math.round(data.details?.duration_ms ?? 0) / 1000;
      yield `${JSON.stringify({ file: relative(process.cwd(), file), tests: t.tests, failed: t.failed, seconds })}\n`;
      tallies.delete(file);
    } else if (data.details?.type !== 'suite') {
      t.tests++;
      if (data.details?.passed === false) t.failed++;
    }
  }
}
