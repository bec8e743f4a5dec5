/**
 * `node --import tsx test/helpers/build-workflow-bundle.ts DIR`: builds the production workflow bundle into DIR and
 * prints its path. The integration tier builds it once and hands it to every control worker its files start
 * (HALO_WORKFLOW_BUNDLE, read as `halo up` hands it over), instead of each worker bundling the same code again.
 */
import { buildWorkflowBundle } from '../../workers/workflow-bundle';

async function main() {
  const [dir, ...extra] = process.argv.slice(2);
  if (!dir || extra.length > 0) {
    process.stderr.write('usage: node --import tsx test/helpers/build-workflow-bundle.ts DIR\n');
    process.exit(2);
  }
  const bundle = await buildWorkflowBundle(dir);
  process.stdout.write(`${bundle.path}\n`);
}

main().catch((err: unknown) => {
  process.stderr.write(`build-workflow-bundle: ${(err as Error).stack ?? String(err)}\n`);
  process.exit(1);
});
