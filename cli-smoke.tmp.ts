import { spawnSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { startTestStack } from './test/helpers/stack';
import { startFakeCriticServer } from './test/helpers/fake-critic-server';
import { startBranchingPolicyServer } from './bench/mcts-sims';

async function main() {
  const [stack, critic, policy] = await Promise.all([startTestStack({ learner: true }), startFakeCriticServer({ kind: 'prefer', substring: 'type', value: 0.6 }), startBranchingPolicyServer()]);
  try {
    const cfgFile = join(stack.home, 'mcts-smoke.yaml');
    writeFileSync(cfgFile, `temporal: { address: "${stack.address}", controlTaskQueue: ${stack.controlQueue}, browserTaskQueue: ${stack.browserQueue} }
stack: { home: ${stack.home} }
policy: { backend: openai, baseUrl: "${policy.url}", model: scripted }
train: { gpuTaskQueue: ${stack.gpuQueue} }
episode: { env: miniwob, maxSteps: 3 }
mcts: { runId: smoke, iterations: 2, tasks: [enter-text, click-button], numSimulations: 5, maxChildren: 3, maxDepth: 3, continueAsNewEvery: 2, evalEvery: 2,
        critic: { backend: openai, baseUrl: "${critic.url}", model: fake-critic }, learningRate: 1.0e-3 }
`);
    const env = { ...process.env, TEMPORAL_ADDRESS: stack.address };
    const run = (args: string[]) => {
      const r = spawnSync('node', ['--import', 'tsx', 'client/cli-smoke.tmp.ts', ...args], { env, encoding: 'utf8' });
      console.log(`$ halo ${args.join(' ')}  (exit ${r.status})\n--- stderr ---\n${r.stderr}--- stdout ---\n${r.stdout}`);
    };
    run(['mcts', '--config', cfgFile]);
    run(['mcts', '--config', cfgFile, '--detach', '--json']);
    run(['--config', cfgFile, 'mcts', 'tree', 'smoke', 'enter-text']);
    run(['--config', cfgFile, 'mcts', 'tree', 'smoke', 'nope']);
    run(['--config', cfgFile, 'status', 'smoke']);
    console.log(require('node:fs').readFileSync(join(stack.home, 'smoke', 'mcts-metrics.jsonl'), 'utf8'));
    console.log(require('node:fs').readdirSync(join(stack.checkpoints, 'smoke')));
  } finally {
    await stack.stop();
    await critic.close();
    await policy.close();
  }
}
main().catch((e) => { console.error(e); process.exit(1); });
