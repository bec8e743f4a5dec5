import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BlobStore } from '../blob/store';
import { SessionManager } from '../activities/session';
import { findMiniwobHtml, startMiniwobServer } from '../env/miniwob-server';
import { listMiniwobTasks } from '../env/miniwob-tasks';

export interface InProcessSessions {
  /** Where the sessions put screenshots and trees (a temp folder, removed by `close`). */
  blobs: BlobStore;
  manager: SessionManager;
  close(): Promise<void>;
}

/**
 * What a browser worker runs, without Temporal: a SessionManager (one Chromium) on a local MiniWoB++ server,
 * called in-process, so a bench can time the browser work alone. `warmPages` as a browser worker's pool (default: none).
 */
export async function startInProcessSessions(opts: { warmPages?: number } = {}): Promise<InProcessSessions> {
  const home = mkdtempSync(join(tmpdir(), 'halo-bench-'));
  const blobs = new BlobStore(join(home, 'blobs'));
  const miniwob = await startMiniwobServer({});
  const manager = new SessionManager({
    blobs,
    miniwobBaseUrl: miniwob.baseUrl,
    miniwobTasks: listMiniwobTasks(findMiniwobHtml()),
    workerTaskQueue: 'in-process',
    workerName: 'bench',
    ...(opts.warmPages === undefined ? {} : { warmPages: opts.warmPages }),
  });
  return {
    blobs,
    manager,
    async close() {
      await manager.shutdown();
      await miniwob.close();
      rmSync(home, { recursive: true, force: true });
    },
  };
}
