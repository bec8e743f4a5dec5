/**
 * A node:test reporter that writes a JSON line per test file, `{ file, tests, failed, seconds }`; a file's last
 * line holds its tally. `seconds` is the runner's own `test:complete` of the file (its process from start to exit,
 * imports and servers included), which per-test durations leave out. Used beside the spec reporter:
 * `node --test --test-reporter=spec --test-reporter-destination=stdout \
 *   --test-reporter=./test/reporters/file-durations.mjs --test-reporter-destination=FILE …`
 * (`tools/test_durations.py` sorts these lines with pytest's and prints the slowest). Plain JavaScript: Node 20
 * loads reporters before `--import tsx` is in place.
 */
import { relative } from 'node:path';

/** @param {AsyncIterable<{ type: string, data: { name?: string, file?: string, nesting?: number, details?: { duration_ms?: number, type?: string, passed?: boolean } } }>} source */
export default async function* fileDurations(source) {
  /** @type {Map<string, { tests: number, failed: number, seconds?: number }>} */
  const tallies = new Map();
  const tally = (file) => {
    let t = tallies.get(file);
    if (!t) {
      t = { tests: 0, failed: 0 };
      tallies.set(file, t);
    }
    return t;
  };
  const line = (file, t) => `${JSON.stringify({ file: relative(process.cwd(), file), tests: t.tests, failed: t.failed, seconds: t.seconds })}\n`;
  for await (const { type, data } of source) {
    // test:complete comes as each test ends; test:pass/fail may wait for their turn in the output, so only
    // test:complete is counted.
    if (type !== 'test:complete' || !data.file) continue;
    const file = data.file;
    const t = tally(file);
    if (data.name === file && data.nesting === 0) {
      // The file itself, named by its path, when its process exits; one that failed outside any test (an import
      // error, a non-zero exit) counts as one failure.
      if (data.details?.passed === false && t.failed === 0) t.failed = 1;
      t.seconds = Math.round(data.details?.duration_ms ?? 0) / 1000;
      yield line(file, t);
    } else if (data.details?.type !== 'suite') {
      t.tests++;
      if (data.details?.passed === false) t.failed++;
      // The runner can announce a file's exit before it has read the file's last results (a process that exits at
      // once under --test-force-exit): those come after its line, each as the file's line again, its counts
      // updated. The last line of a file is its tally.
      if (t.seconds !== undefined) yield line(file, t);
    }
  }
}
