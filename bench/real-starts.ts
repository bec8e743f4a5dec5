/**
 * What does a REAL episode start cost, through /config (today's path, and `real.forkMode: replay`) and from the
 * browser worker's kept copy of the task's start state (activities/real-start-states.ts)? The local
 * REAL-protocol test site answers every request after `--latency` ms (a hosted clone's round trip); one
 * in-process SessionManager (no Temporal) starts episodes of one task alternately both ways, after one
 * start that keeps the state. Prints the medians, their ratio and how many copies were kept.
 *
 *   node --import tsx bench/real-starts.ts [--repeats 5] [--latency 150] [--task gomail-18]
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { SessionManager } from '../activities/session';
import { BlobStore } from '../blob/store';
import type { StartSessionInput } from '../lib/episode/episode-types';
import { parseRewardWeights } from '../lib/rewards/weights';
import { startFakeRealSite } from '../testing/fake-real-site';
import { fmt, load, median, runBench } from './bench-run';

const { values } = parseArgs({
  options: {
    repeats: { type: 'string', default: '5' },
    latency: { type: 'string', default: '150' },
    task: { type: 'string', default: 'gomail-18' },
  },
});
const repeats = Number(values.repeats);

async function main() {
  const site = await startFakeRealSite({ latencyMs: Number(values.latency) });
  const blobRoot = await mkdtemp(join(tmpdir(), 'halo-real-starts-'));
  const manager = new SessionManager({
    blobs: new BlobStore(blobRoot),
    miniwobBaseUrl: 'http://127.0.0.1:9/',
    miniwobTasks: [],
    workerTaskQueue: 'in-process',
    workerName: 'bench',
    realOriginOverride: `${site.origin}/`,
    realStartStates: 4,
  });
  const input = (episodeId: string, mode: 'snapshot' | 'replay'): StartSessionInput => ({
    spec: { env: 'real', task: values.task!, seed: 0 },
    replay: [],
    episodeId,
    rewardWeights: parseRewardWeights({}),
    envOptions: { realRunId: '0', evaluateAtCap: false, realForkMode: mode },
  });
  const ms: Record<'config' | 'copy', number[]> = { config: [], copy: [] };
  let copies = 0;
  const timed = async (i: StartSessionInput) => {
    const t = performance.now();
    const r = await manager.start(i);
    const took = performance.now() - t;
    await manager.close(r.sessionId);
    return { took, r };
  };
  try {
    // The first start goes through /config and keeps the state; it warms the browser up too.
    const first = await timed(input('keep', 'snapshot'));
    console.error(`first start (through /config, keeping the state): ${fmt(first.took, 3)} s`);
    for (let rep = 0; rep < repeats; rep++) {
      const order: ('config' | 'copy')[] = rep % 2 ? ['copy', 'config'] : ['config', 'copy'];
      for (const way of order) {
        const { took, r } = await timed(input(`bench-${rep}-${way}`, way === 'copy' ? 'snapshot' : 'replay'));
        ms[way].push(took);
        if (way === 'copy' && r.startState === 'copy') copies++;
      }
      console.error(`repeat ${rep + 1}/${repeats}: /config ${fmt(ms.config.at(-1)!, 3)} s, copy ${fmt(ms.copy.at(-1)!, 3)} s`);
    }
  } finally {
    await manager.shutdown();
    await site.close();
    await rm(blobRoot, { recursive: true, force: true });
  }
  const [c, k] = [median(ms.config), median(ms.copy)];
  console.log(
    `REAL episode starts: local REAL-protocol site with ${values.latency} ms before every answer, task ${values.task}, ${repeats} starts each way ` +
      `(medians), alternating; in-process SessionManager, one Chromium; ${cpus().length} CPUs; ${new Date().toISOString()}`,
  );
  console.log('');
  console.log('| start | s | vs /config |');
  console.log('|---|---|---|');
  console.log(`| through /config | ${fmt(c, 3)} | 1.00x |`);
  console.log(`| from the kept start state | ${fmt(k, 3)} | ${(c / k).toFixed(2)}x faster |`);
  console.log(`copies kept: ${copies}/${repeats} (a copy whose /finish differs goes through /config); load avg at the end ${load()}`);
}

runBench(main);
