/**
 * What does reading a REAL site's state from a copy of the episode's storage cost next to reading it in the
 * episode's own background page? Training reads it after every step (shaped rewards) and for snapshots and fork
 * checks; the copy (env/real-state-copy.ts: storageState, the copy context's storage replaced, /finish) keeps an app booted by the
 * read from writing into the judged state. The local REAL-protocol site answers after `--latency` ms; one session,
 * reads alternated, medians printed with their ratio.
 *
 *   node --import tsx bench/real-state-reads.ts [--repeats 10] [--latency 150]
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { SessionManager } from '../activities/session';
import { BlobStore } from '../blob/store';
import { parseRewardWeights } from '../lib/rewards/weights';
import { startFakeRealSite } from '../testing/fake-real-site';
import { realEnvOf } from '../testing/real-sessions';
import { fmt, median, printBenchHeader, printLoadAtEnd, runBench } from './bench-run';

const { values } = parseArgs({ options: { repeats: { type: 'string', default: '10' }, latency: { type: 'string', default: '150' } } });
const repeats = Number(values.repeats);

async function main(): Promise<void> {
  printBenchHeader('real-state-reads');
  const site = await startFakeRealSite({ latencyMs: Number(values.latency) });
  const blobRoot = await mkdtemp(join(tmpdir(), 'halo-real-reads-'));
  const manager = new SessionManager({
    blobs: new BlobStore(blobRoot),
    miniwobBaseUrl: 'http://127.0.0.1:9/',
    miniwobTasks: [],
    workerTaskQueue: 'in-process',
    workerName: 'bench',
    realOriginOverride: `${site.origin}/`,
  });
  try {
    const start = await manager.start({
      spec: { env: 'real', task: 'gomail-18', seed: 0 },
      replay: [],
      episodeId: 'bench-reads',
      rewardWeights: parseRewardWeights({}),
      envOptions: { realRunId: '0', evaluateAtCap: false },
    });
    const env = realEnvOf(manager, start.sessionId);
    const ms: Record<'episode' | 'copy', number[]> = { episode: [], copy: [] };
    const timed = async (read: () => Promise<unknown>) => {
      const t = performance.now();
      await read();
      return performance.now() - t;
    };
    await env.copiedStateText();
    for (let i = 0; i < repeats; i++) {
      ms.episode.push(await timed(() => env.finalStateText()));
      ms.copy.push(await timed(() => env.copiedStateText()));
    }
    await manager.close(start.sessionId);
    const [a, b] = [median(ms.episode), median(ms.copy)];
    console.log(`\n/finish read, ${values.latency} ms per request, ${repeats} reads each (medians):\n`);
    console.log('| read | s | copy / episode |\n|---|---|---|');
    console.log(`| in the episode's background page | ${fmt(a, 3)} | |`);
    console.log(`| in a copy of the storage (a kept copy context) | ${fmt(b, 3)} | ${(b / a).toFixed(2)}x |`);
  } finally {
    await manager.shutdown();
    await site.close();
    await rm(blobRoot, { recursive: true, force: true });
  }
  printLoadAtEnd();
}

runBench(main);
