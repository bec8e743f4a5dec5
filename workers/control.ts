import '../host/load-env'; // first: .env fills in what the environment does not set
import { hostname } from 'node:os';
import { join } from 'node:path';
import { Worker } from '@temporalio/worker';
import { blobStoreFor } from '../blob/store';
import { createControlActivities } from '../activities/control';
import { createEvalRecordActivities } from '../activities/eval-records';
import { createDiskActivities } from '../activities/disk';
import { createLearnerBatchActivities } from '../activities/learner-batches';
import { adapterActivities } from '../activities/adapters';
import { createGrpoBatchActivities } from '../activities/grpo-batch';
import { createMetricsActivities } from '../activities/metrics';
import { createCriticActivities } from '../activities/critic';
import { createMctsStoreActivities } from '../activities/mcts-store';
import { haloHome } from '../host/home';
import { createCurvesSink } from '../host/curves';
import { connectWorker, installRuntime, queueNames, recordedStore, takeOverLedger } from './runtime';
import { WORKER_SHUTDOWN } from './shutdown';
import { activityErrorsInterceptor } from './activity-errors';
import { buildWorkflowBundle, readWorkflowBundle } from './workflow-bundle';

/**
 * Runs the workflows (deterministic orchestration) and the activities that are plain I/O: policy sampling,
 * trajectory records, learner batch blobs (validated against the learner contract) and vLLM adapter loading.
 * The learner's own activities run on the Python worker (`gpu` queue), not here.
 */
async function main() {
  const log = installRuntime('control-worker');
  const { connection, namespace, settings } = await connectWorker();
  const ledger = await takeOverLedger('control-worker', settings, log);
  const blobs = await recordedStore(blobStoreFor(haloHome()), settings);
  const batches = createLearnerBatchActivities(blobs);
  // TensorBoard / W&B curves of each run, synced from its metrics file after every metrics append.
  const curves = createCurvesSink({ warn: (msg, fields) => log.warn(fields ?? {}, msg) });
  // The bundle `halo up` replayed the open workflows against (HALO_WORKFLOW_BUNDLE), or one built now.
  const bundled = process.env.HALO_WORKFLOW_BUNDLE;
  const bundle = bundled ? readWorkflowBundle(bundled) : await buildWorkflowBundle(join(haloHome(), 'bundles'));
  const worker = await Worker.create({
    connection,
    namespace,
    taskQueue: queueNames().control,
    workflowBundle: { codePath: bundle.path },
    // `<pid>@<host>` first: `halo up` finds its own poller by it. The build says which workflow code runs.
    identity: `${process.pid}@${hostname()} halo-control build=${bundle.buildId}`,
    activities: {
      ...createControlActivities(blobs),
      ...batches,
      ...createGrpoBatchActivities(blobs, batches),
      ...createMetricsActivities(haloHome(), curves),
      ...adapterActivities,
      ...createCriticActivities(blobs),
      ...createMctsStoreActivities(blobs, batches),
      ...createEvalRecordActivities(blobs),
      ...createDiskActivities(haloHome()),
    },
    interceptors: { activity: [activityErrorsInterceptor(), ledger.interceptor()] },
    shutdownGraceTime: WORKER_SHUTDOWN.graceMs,
    shutdownForceTime: WORKER_SHUTDOWN.forceMs,
  });
  log.info({ taskQueue: queueNames().control, namespace, pid: process.pid, buildId: bundle.buildId }, 'control worker ready');
  await worker.run();
  await connection.close();
  log.info('control worker stopped');
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
