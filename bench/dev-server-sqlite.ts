/**
 * What `stack.sqliteSynchronous: full` costs the local dev server: workflow starts per second with the SQLite
 * file at `synchronous=normal` and at `full` (journal_mode=wal both), one start at a time (each waits for its
 * commit) and `--concurrency` at once. Nothing polls the queue: a start is the server's write alone.
 *
 *   node --import tsx bench/dev-server-sqlite.ts [--starts 300] [--concurrency 16] [--rounds 5]
 */
import { Client } from '@temporalio/client';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { startDevServerOnFreePort } from '../client/temporal-server';

const { values } = parseArgs({ options: { starts: { type: 'string', default: '300' }, concurrency: { type: 'string', default: '16' }, rounds: { type: 'string', default: '5' } } });
const starts = Number(values.starts);
const concurrency = Number(values.concurrency);
const rounds = Number(values.rounds);
for (const [k, n] of Object.entries({ starts, concurrency, rounds })) {
  if (!Number.isInteger(n) || n < 1) throw new Error(`--${k} must be a whole number ≥ 1, got ${JSON.stringify(values[k as keyof typeof values])}`);
}

async function startsPerSecond(client: Client, label: string, parallel: number): Promise<number> {
  let next = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: parallel }, async () => {
      for (let i = next++; i < starts; i = next++) {
        await client.workflow.start('benchNothing', { taskQueue: 'bench-nobody-polls', workflowId: `${label}-${i}` });
      }
    }),
  );
  return starts / ((performance.now() - t0) / 1000);
}

async function measure(sync: 'normal' | 'full', round: number): Promise<{ serial: number; parallel: number }> {
  const home = mkdtempSync(join(tmpdir(), `halo-sqlite-${sync}-`));
  const { server, connection } = await startDevServerOnFreePort({ home, name: 'temporal', sqliteSynchronous: sync });
  try {
    const client = new Client({ connection, namespace: 'default' });
    await startsPerSecond(client, `warm-${round}`, 4);
    const serial = await startsPerSecond(client, `serial-${round}`, 1);
    const parallel = await startsPerSecond(client, `parallel-${round}`, concurrency);
    return { serial, parallel };
  } finally {
    await connection.close();
    process.kill(server.pid, 'SIGTERM');
    await new Promise((r) => setTimeout(r, 1000));
    rmSync(home, { recursive: true, force: true });
  }
}

async function main() {
  const rows: { sync: string; round: number; serial: number; parallel: number }[] = [];
  for (let round = 1; round <= rounds; round++) {
    for (const sync of ['normal', 'full'] as const) {
      const r = await measure(sync, round);
      rows.push({ sync, round, ...r });
      console.log(`round ${round} synchronous=${sync}: ${r.serial.toFixed(1)} starts/s one at a time, ${r.parallel.toFixed(1)} starts/s ${concurrency} at once`);
    }
  }
  // The median of the rounds: a shared box's other load swings single rounds both ways.
  const median = (sync: string, k: 'serial' | 'parallel') => {
    const xs = rows
      .filter((r) => r.sync === sync)
      .map((r) => r[k])
      .sort((a, b) => a - b);
    const m = xs.length >> 1;
    return xs.length % 2 ? xs[m] : (xs[m - 1] + xs[m]) / 2;
  };
  for (const k of ['serial', 'parallel'] as const) {
    const n = median('normal', k);
    const f = median('full', k);
    console.log(`${k}: normal ${n.toFixed(1)}/s, full ${f.toFixed(1)}/s (full/normal ${(f / n).toFixed(2)}, median of ${rounds} rounds)`);
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
