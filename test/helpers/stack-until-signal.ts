/**
 * `node --import tsx test/helpers/stack-until-signal.ts`: starts a test stack (a dev server, a control worker and a
 * browser worker), prints `ready` and waits to be killed: what a test file looks like when node's runner ends
 * it past its timeout. test/integration/stack-cleanup.test.ts reads which processes outlive it.
 */
import { startTestStack } from '../../testing/stack';

async function main() {
  await startTestStack({ browserWorkers: 1 });
  process.stdout.write('ready\n');
  setInterval(() => {}, 60_000);
}

main().catch((err: unknown) => {
  process.stderr.write(`stack-until-signal: ${(err as Error).stack ?? String(err)}\n`);
  process.exit(1);
});
