// Saves the screenshots bench/pixel_agreement.py measures: the observations an episode's first step sends the policy,
// from real MiniWoB++ task pages and from the REAL stand-in site (testing/fake-real-site.ts), through the project's own
// environments (1280x720 viewport, the zoom and settle of a run).
//
//   node --import tsx bench/capture-screens.ts [OUT_DIR]        # default bench/screens
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { BlobStore } from '../blob/store';
import { DEFAULT_VIEWPORT, launchChromium } from '../env/browser';
import { MiniWobEnv } from '../env/miniwob';
import { startMiniwobServer } from '../env/miniwob-server';
import { RealEnv } from '../env/real';
import { startFakeRealSite } from '../testing/fake-real-site';

const MINIWOB_TASKS = ['click-button', 'enter-text', 'login-user', 'click-checkboxes', 'choose-list', 'social-media'];
const REAL_TASKS = ['gomail-18'];

async function main() {
  const out = resolve(process.argv[2] ?? join(__dirname, 'screens'));
  await mkdir(out, { recursive: true });
  const blobRoot = await mkdtemp(join(tmpdir(), 'halo-screens-'));
  const blobs = new BlobStore(blobRoot);
  const browser = await launchChromium();
  const miniwob = await startMiniwobServer();
  const site = await startFakeRealSite();
  const save = async (name: string, ref: string) => {
    const file = join(out, `${name}.png`);
    await writeFile(file, await blobs.get(ref));
    console.log(file);
  };
  try {
    for (const task of MINIWOB_TASKS) {
      const context = await browser.newContext({ viewport: DEFAULT_VIEWPORT });
      const env = new MiniWobEnv({ page: await context.newPage(), baseUrl: miniwob.baseUrl, blobs });
      await save(`miniwob-${task}`, (await env.reset({ env: 'miniwob', task, seed: 0 })).screenshotRef);
      await context.close();
    }
    for (const task of REAL_TASKS) {
      const context = await browser.newContext({ viewport: DEFAULT_VIEWPORT });
      const env = new RealEnv({ context, blobs, runId: '0', originOverride: () => `${site.origin}/` });
      await save(`real-${task}`, (await env.reset({ env: 'real', task, seed: 0 })).screenshotRef);
      await env.close();
      await context.close().catch(() => undefined);
    }
  } finally {
    await browser.close();
    await miniwob.close();
    await site.close();
    await rm(blobRoot, { recursive: true, force: true });
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
