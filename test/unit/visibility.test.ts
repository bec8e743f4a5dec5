import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Client } from '@temporalio/client';
import { listEpisodes, listRuns } from '../../client/commands/runs';
import { episodesQuery, runsQuery, VisibilityQueryError } from '../../client/visibility';

test('visibility queries of the CLI: flags are checked, never spliced in', () => {
  assert.equal(runsQuery({}), "HaloKind IN ('train', 'mcts', 'eval')");
  assert.equal(runsQuery({ kind: 'train', mode: 'grpo', status: 'Running' }), "HaloKind = 'train' AND HaloMode = 'grpo' AND ExecutionStatus = 'Running'");
  assert.equal(runsQuery({ mode: 'Qwen/Qwen3-VL-8B-Instruct' }), "HaloKind IN ('train', 'mcts', 'eval') AND HaloMode = 'Qwen/Qwen3-VL-8B-Instruct'");
  assert.equal(episodesQuery('grpo-local'), "HaloRunId = 'grpo-local' AND HaloKind = 'episode'");
  const injections = ["x' OR HaloKind = 'episode", "train' OR '1'='1", 'a\\', "a'", 'a b', '', 'train)', 'x"'];
  for (const bad of injections) {
    assert.throws(() => runsQuery({ kind: bad }), VisibilityQueryError, `--kind ${bad}`);
    assert.throws(() => runsQuery({ mode: bad }), VisibilityQueryError, `--mode ${bad}`);
    assert.throws(() => runsQuery({ status: bad }), VisibilityQueryError, `--status ${bad}`);
    assert.throws(() => episodesQuery(bad), VisibilityQueryError, `run ${bad}`);
  }
  assert.throws(() => runsQuery({ kind: 'episode' }), /--kind must be one of train, mcts, eval/);
});

test('listRuns and listEpisodes refuse a bad filter before asking the server', async () => {
  const asked: string[] = [];
  const client = {
    workflow: {
      list: ({ query }: { query: string }) => {
        asked.push(query);
        return (async function* () {})();
      },
    },
  } as unknown as Client;
  await assert.rejects(listRuns(client, { mode: "grpo' OR HaloKind = 'episode" }), VisibilityQueryError);
  await assert.rejects(listRuns(client, { kind: "train' OR 'a'='a" }), VisibilityQueryError);
  await assert.rejects(listEpisodes(client, "x' OR HaloRunId != '"), VisibilityQueryError);
  assert.deepEqual(asked, []);
  assert.deepEqual(await listRuns(client, { kind: 'mcts' }), []);
  assert.deepEqual(asked, ["HaloKind = 'mcts'"]);
});
