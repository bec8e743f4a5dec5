import { cpus, loadavg } from 'node:os';

/** The median; the mean of the two middle values for an even count, NaN for none. */
export function median(xs: number[]): number {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}

/** The 1, 5 and 15 minute load averages: a result taken on a busy machine says so next to it. */
export const load = () =>
  loadavg()
    .map((x) => x.toFixed(2))
    .join(' ');
export const machine = () => `${cpus().length}-core CPU VM (${cpus()[0]?.model ?? '?'})`;
/** Milliseconds as seconds. */
export const fmt = (msv: number, digits = 2) => (msv / 1000).toFixed(digits);

/** A small deterministic generator (xorshift32), so a bench's random schedule (kills, preemptions) can be repeated. */
export function rng(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return (s >>> 0) / 2 ** 32;
  };
}

const shellWord = (s: string) => (/^[A-Za-z0-9_./,=:@%+-]+$/.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`);

/** This bench's command line as a user would type it again (arguments quoted for the shell where needed). */
export const benchCommandLine = (name: string) => [`node --import tsx bench/${name}.ts`, ...process.argv.slice(2).map(shellWord)].join(' ');

/** A report's first lines: which bench with which arguments, when, on what, and the load it started under. */
export function printBenchHeader(name: string): void {
  console.log(`# ${name}: ${new Date().toISOString()}, ${machine()}, load avg at start ${load()}`);
  console.log(`command: node --import tsx bench/${name}.ts ${process.argv.slice(2).join(' ')}`.trim());
}

export function printLoadAtEnd(): void {
  console.log('');
  console.log(`load avg at the end ${load()}`);
}

/** Runs a bench's `main`; a failure prints its error and exits non-zero. */
export function runBench(main: () => Promise<void>): void {
  main().catch((err) => {
    console.error(err);
    process.exit(1);
  });
}
