import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SessionManager } from '../activities/session';
import type { SessionDeps } from '../activities/session-deps';
import { BlobStore } from '../blob/store';
import { RealEnv } from '../env/real';
import { startFakeRealSite, type FakeRealSite } from './fake-real-site';

/** A browser worker's SessionManager in-process, serving REAL tasks from the local REAL-protocol site. */
export interface RealSessions {
  site: FakeRealSite;
  blobs: BlobStore;
  manager: SessionManager;
  close(): Promise<void>;
}

export async function startRealSessions(name: string, deps: Partial<SessionDeps> = {}): Promise<RealSessions> {
  const site = await startFakeRealSite();
  const blobRoot = await mkdtemp(join(tmpdir(), `halo-${name}-blobs-`));
  const blobs = new BlobStore(blobRoot);
  const manager = new SessionManager({
    blobs,
    miniwobBaseUrl: 'http://127.0.0.1:9/',
    miniwobTasks: [],
    workerTaskQueue: name,
    workerName: name,
    realOriginOverride: `${site.origin}/`,
    ...deps,
  });
  return {
    site,
    blobs,
    manager,
    async close() {
      await manager.shutdown();
      await site.close();
      await rm(blobRoot, { recursive: true, force: true });
    },
  };
}

/** The internals a test compares: a live session's RealEnv. */
export function realEnvOf(manager: SessionManager, sessionId: string): RealEnv {
  const s = (manager as unknown as { sessions: Map<string, { env: unknown }> }).sessions.get(sessionId);
  assert.ok(s && s.env instanceof RealEnv, `no REAL session ${sessionId}`);
  return s.env;
}
