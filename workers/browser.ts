import '../host/load-env'; // first: .env fills in what the environment does not set
import { Worker } from '@temporalio/worker';
import { hostname } from 'node:os';
import { randomBytes } from 'node:crypto';
import { blobStoreFor } from '../blob/store';
import { SessionManager } from '../activities/session';
import { createSessionActivities } from '../activities/session-activities';
import { haloHome } from '../host/home';
import { modelKeyVars } from '../env/child-env';
import { findMiniwobHtml, startMiniwobServer } from '../env/miniwob-server';
import { listMiniwobTasks } from '../env/miniwob-tasks';
import { settleMsFromEnv } from '../env/miniwob';
import { connectWorker, installRuntime, queueNames, recordedStore, takeOverLedger } from './runtime';
import { WORKER_SHUTDOWN } from './shutdown';
import { activityErrorsInterceptor } from './activity-errors';
import { browserSlots } from './browser-slots';
import { warmPagesFromEnv } from '../activities/warm-pages';
import { fastReplayFromEnv } from '../activities/session-replay';
import { realStartStatesFromEnv } from '../activities/real-start-states';

/**
 * Holds browser sessions. Polls the shared browser queue (anyone may open a session here) and its own
 * queue (everything else about a session it opened), so a session's steps always reach the right page.
 */
async function main() {
  // .env may have filled them in: pages from the web render in this process's children.
  for (const k of modelKeyVars(process.env)) delete process.env[k];
  const log = installRuntime('browser-worker');
  const slots = browserSlots();
  const { connection, namespace, settings } = await connectWorker();
  const ledger = await takeOverLedger('browser-worker', settings, log);
  const htmlDir = findMiniwobHtml();
  const miniwob = await startMiniwobServer({});
  const workerName = `${hostname()}-${process.pid}-${randomBytes(3).toString('hex')}`;
  const ownQueue = `${queueNames().browser}@${workerName}`;
  const manager = new SessionManager({
    blobs: await recordedStore(blobStoreFor(haloHome()), settings),
    miniwobBaseUrl: miniwob.baseUrl,
    miniwobTasks: listMiniwobTasks(htmlDir),
    workerTaskQueue: ownQueue,
    workerName,
    realOriginOverride: process.env.HALO_REAL_ORIGIN || undefined,
    siteConcurrency: Number(process.env.HALO_SITE_CONCURRENCY || 4),
    warmPages: warmPagesFromEnv(),
    fastReplay: fastReplayFromEnv(),
    realStartStates: realStartStatesFromEnv(),
    miniwobSettleMs: settleMsFromEnv(),
  });
  const activities = createSessionActivities(manager);
  const shared = await Worker.create({
    connection,
    namespace,
    taskQueue: queueNames().browser,
    activities: { startSession: activities.startSession },
    ...slots.shared,
    interceptors: { activity: [activityErrorsInterceptor(), ledger.interceptor()] },
    shutdownGraceTime: WORKER_SHUTDOWN.graceMs,
    shutdownForceTime: WORKER_SHUTDOWN.forceMs,
  });
  const own = await Worker.create({
    connection,
    namespace,
    taskQueue: ownQueue,
    activities,
    ...slots.own,
    interceptors: { activity: [activityErrorsInterceptor(), ledger.interceptor()] },
    shutdownGraceTime: WORKER_SHUTDOWN.graceMs,
    shutdownForceTime: WORKER_SHUTDOWN.forceMs,
  });
  log.info({ sharedQueue: queueNames().browser, ownQueue, miniwob: miniwob.baseUrl, pid: process.pid }, 'browser worker ready');
  await Promise.all([shared.run(), own.run()]);
  await manager.shutdown();
  await miniwob.close();
  await connection.close();
  log.info('browser worker stopped');
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
