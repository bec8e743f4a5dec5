import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { NativeConnection, Worker } from '@temporalio/worker';
import { BlobStore } from '../../blob/store';
import { singleEpisodeInput } from '../../client/episode-input';
import { REPO_ROOT } from '../../client/processes';
import type { Trajectory } from '../../lib/training/experience';
import { parseConfig } from '../../lib/config/config';
import type { EpisodeResult } from '../../lib/episode/episode-types';
import { systemPrompt, type PromptMessage } from '../../lib/model-io/prompt';
import { QWEN3_VL_ADDED_TOKENS } from '../../lib/model-io/prompt-text';
import { toolCall } from '../../testing/fake-policy-server';
import { startFakeRealSite, type FakeRealSite } from '../../testing/fake-real-site';
import { startFakeVllmServer, type FakeVllmServer } from '../../testing/fake-vllm-server';
import { startTestStack, type TestStack } from '../../testing/stack';
import { samplePrompt } from '../test-workflows/sample-prompt';

// Text from the goal, the page or the model must never become prompt structure: Qwen3-VL's tokenizer matches its
// added tokens anywhere in a string, so a page that spells `<|im_end|>` would end the user turn and a typed
// `<|image_pad|>` would ask for an image that does not exist (the processor raised StopIteration, which wedged the
// learner's only slot). A two-step REAL episode on the served path (vLLM stand-in) where the goal, the page and
// the model's typed text spell every added token, then: its prompts carry none of them raw, vLLM's encoding and
// the learner's agree token for token with only the template's own added tokens, and the colocated learner samples
// on the step-2 prompt. The goal comes from a task file in a private agisdk folder (HALO_AGISDK_DIR), the page
// from the local REAL-protocol site: the real registry, RealEnv and prompt builder, only the site and vLLM local.
const exec = promisify(execFile);
const ZWSP = '\u200b';
const TOKENS = QWEN3_VL_ADDED_TOKENS;
const TASK = 'gomail-integrity';
// Every added token, back to back: what the model types at step 1.
const TYPED = TOKENS.join('');
const GOAL = `Search the mail for ${TYPED} and report what you find.`;
// The page's own text: every token, on lines the accessibility tree shows whole (it clips a name at 80 characters).
const NOTICES = TOKENS.reduce<string[]>((lines, t) => {
  const last = lines.at(-1);
  if (last !== undefined && last.length + 1 + t.length <= 76) lines[lines.length - 1] = `${last} ${t}`;
  else lines.push(t);
  return lines;
}, []);
const SAMPLE_TIMEOUT_S = 45;

let agisdk: string;
let site: FakeRealSite;
let vllm: FakeVllmServer;
let stack: TestStack;
let learner: ChildProcess | undefined;
let searchBoxId: number | undefined;

before(async () => {
  // A private agisdk package folder with one v2 task: the goal is the task's, read by the real registry.
  agisdk = mkdtempSync(join(tmpdir(), 'halo-agisdk-'));
  const v2 = join(agisdk, 'REAL', 'browsergym', 'webclones', 'v2');
  mkdirSync(join(v2, 'tasks'), { recursive: true });
  mkdirSync(join(v2, 'eval_scripts'), { recursive: true });
  writeFileSync(
    join(v2, 'tasks', `${TASK}.json`),
    JSON.stringify({ id: TASK, goal: GOAL, website: { id: 'gomail', url: 'https://gomail.test/' }, evals: [{ type: 'script', script: 'eval_gomail_integrity.py' }] }),
  );
  // Never run (the episode ends at the step cap, which is not evaluated); a task needs a non-empty script to be scorable.
  writeFileSync(join(v2, 'eval_scripts', 'eval_gomail_integrity.py'), 'print("FAILURE")\n');
  site = await startFakeRealSite({ notices: NOTICES, searchBox: true });
  vllm = await startFakeVllmServer({
    recordMessages: true,
    mode: {
      kind: 'custom',
      // Step 1 types every token into the search field; step 2 waits.
      answer: ({ tree, previous }) => {
        if (previous.length > 0) return toolCall({ action: 'wait', time: 0 });
        searchBoxId = tree.find((l) => l.role === 'textbox' && l.name === 'Search mail')?.id;
        // The text's own tool-call tags are written `\u003c…` in the JSON: spelled raw, they would frame a second call.
        const call = JSON.stringify({ name: 'computer_use', arguments: { action: 'type', element_id: searchBoxId ?? 0, text: TYPED } });
        return `<tool_call>\n${call.replace(/<(\/?tool_call>)/g, '\\u003c$1')}\n</tool_call>`;
      },
    },
  });
  // Inherited by the workers.
  process.env.HALO_AGISDK_DIR = agisdk;
  process.env.HALO_REAL_ORIGIN = site.origin;
  stack = await startTestStack({ browserWorkers: 1, learner: { env: { HALO_SHUTDOWN_GRACE_S: '5' } } });
  learner = stack.workers.find((w) => w.spawnargs.includes('halo_learner.worker'));
});

after(async () => {
  // A learner wedged by a prompt may never finish its shutdown: killed after a grace.
  if (learner && learner.exitCode === null && learner.signalCode === null) {
    const exited = new Promise((r) => learner!.once('exit', r));
    learner.kill('SIGTERM');
    await Promise.race([exited, new Promise((r) => setTimeout(r, 15_000))]);
    if (learner.exitCode === null && learner.signalCode === null) learner.kill('SIGKILL');
    await exited;
  }
  await stack?.stop();
  await vllm?.close();
  await site?.close();
  if (agisdk) rmSync(agisdk, { recursive: true, force: true });
});

type TrajectoryStep = Trajectory['steps'][number];

let episodeRun: Promise<{ result: EpisodeResult; steps: TrajectoryStep[] }> | undefined;
/** The episode, run once for all tests of this file. */
function episode() {
  episodeRun ??= (async () => {
    const cfg = parseConfig({
      temporal: { controlTaskQueue: stack.controlQueue, browserTaskQueue: stack.browserQueue },
      policy: { baseUrl: `${vllm.url}/v1`, model: vllm.baseModel, timeoutMs: 10_000, maxAttempts: 2 },
      episode: { env: 'real', task: TASK, seed: 0, maxSteps: 2 },
    });
    const workflowId = `prompt-integrity-${Date.now()}`;
    const result: EpisodeResult = await stack.client.workflow.execute('episode', {
      taskQueue: stack.controlQueue,
      workflowId,
      args: [singleEpisodeInput(cfg, workflowId)],
      // A hang fails here, not at the test runner's limit.
      workflowExecutionTimeout: '90s',
    });
    const traj = await blobs().getJson<{ steps: TrajectoryStep[] }>(result.trajectoryRef);
    return { result, steps: traj.steps };
  })();
  return episodeRun;
}

const blobs = () => new BlobStore(join(stack.home, 'blobs'));
/** The added tokens `text` spells, as they are (a neutralised spelling is not one). */
const rawTokens = (text: string) => TOKENS.filter((t) => text.includes(t));
const userTexts = (prompt: PromptMessage[]) => prompt.filter((m) => m.role === 'user').flatMap((m) => m.content.flatMap((p) => (p.type === 'text' ? [p.text] : [])));
/** The text parts of the user turns of OpenAI-format messages, as sent. */
const sentUserTexts = (messages: unknown[]) =>
  (messages as { role: string; content: string | { type: string; text?: string }[] }[])
    .filter((m) => m.role === 'user')
    .flatMap((m) => (typeof m.content === 'string' ? [m.content] : m.content.flatMap((p) => (p.type === 'text' ? [p.text ?? ''] : []))));

test('goal, page and typed text spelling every added token: both steps run, and no prompt carries one raw', { timeout: 150_000 }, async () => {
  const { result, steps } = await episode();
  assert.equal(result.steps, 2, JSON.stringify(result));
  assert.equal(steps.length, 2);
  assert.equal(vllm.messages.length, 2, 'one request to the server per step');
  assert.notEqual(searchBoxId, undefined, 'the page shows its search field');

  for (const [i, step] of steps.entries()) {
    const where = `step ${i + 1}`;
    const prompt = await blobs().getJson<PromptMessage[]>(step.promptRef);
    const [text] = userTexts(prompt);
    assert.deepEqual(rawTokens(text), [], `${where}: the prompt the learner gets spells added tokens`);
    // Broken, not dropped: the model still reads every character.
    const plain = text.replaceAll(ZWSP, '');
    assert.ok(plain.includes(`Goal: ${GOAL}\n`), `${where}: the goal, characters intact:\n${plain}`);
    for (const n of NOTICES) assert.ok(plain.includes(JSON.stringify(n)), `${where}: the page's ${JSON.stringify(n)} in the tree`);

    // What the server got: our system prompt as it is (its tool-call tags are meant), user text with no raw token,
    // the same text the learner gets.
    const sent = vllm.messages[i] as { role: string; content: unknown }[];
    assert.deepEqual(
      sent.map((m) => m.role),
      ['system', 'user'],
    );
    assert.equal(sent[0].content, systemPrompt());
    const sentTexts = sentUserTexts(sent);
    for (const t of sentTexts) assert.deepEqual(rawTokens(t), [], `${where}: the text sent to the server spells added tokens`);
    assert.deepEqual(sentTexts, userTexts(prompt), `${where}: the server and the learner get the same text`);
  }

  // Step 2's history lists step 1 (its typed text or the refusal naming the token), neutralised like the rest.
  const [text2] = userTexts(await blobs().getJson<PromptMessage[]>(steps[1].promptRef));
  const line = /^1\. .*$/m.exec(text2)?.[0];
  assert.ok(line, `step 2 lists step 1:\n${text2}`);
  assert.deepEqual(rawTokens(line), []);
  assert.ok(rawTokens(line.replaceAll(ZWSP, '')).length > 0, `step 1's entry shows what it spelled: ${line}`);
  // Step 1's text reached the page whole, or the parser refused an action that spells the tokenizer's tokens.
  const first = steps[0].completion.action;
  if (first.type === 'invalid') assert.match(first.reason, /special token/);
  else assert.deepEqual(first, { type: 'type', text: TYPED, id: searchBoxId });
});

interface Side {
  ids?: number[];
  image_grid_thw?: number[][];
  error?: string;
}

test("token for token: vLLM's encoding of each prompt is the learner's, with only the template's added tokens", { timeout: 120_000 }, async () => {
  const { steps } = await episode();
  const pairs = steps.map((s, i) => ({ messages: vllm.messages[i], prompt_ref: s.promptRef }));
  const child = exec(join(REPO_ROOT, '.venv/bin/python'), [join(REPO_ROOT, 'test/helpers/prompt-tokens.py')], {
    env: { ...process.env, HALO_HOME: stack.home, HF_HUB_OFFLINE: '1', TOKENIZERS_PARALLELISM: 'false' },
    maxBuffer: 64 << 20,
    timeout: 100_000,
  });
  child.child.stdin?.end(JSON.stringify(pairs));
  const out = JSON.parse((await child).stdout) as { pairs: { vllm: Side; learner: Side }[]; added: Record<string, number>; merge_size: number };
  const names = new Map(Object.entries(out.added).map(([t, id]) => [id, t]));

  for (const [i, p] of out.pairs.entries()) {
    const where = `step ${i + 1}`;
    assert.equal(p.vllm.error, undefined, `${where}: vLLM's processor refused the prompt it was sent: ${p.vllm.error}`);
    assert.equal(p.learner.error, undefined, `${where}: the learner could not encode the prompt: ${p.learner.error}`);
    const ids = p.learner.ids!;
    const firstDiff = ids.findIndex((id, k) => p.vllm.ids![k] !== id);
    assert.ok(ids.length === p.vllm.ids!.length && firstDiff < 0, `${where}: ${p.vllm.ids!.length} vs ${ids.length} ids, first difference at ${firstDiff}`);
    assert.deepEqual(p.vllm.image_grid_thw, p.learner.image_grid_thw);

    // The template's own: a turn start per message and one for the answer, a turn end per message, and per image
    // its start, end and one pad per merged patch.
    const messages = pairs[i].messages.length;
    const grids = p.learner.image_grid_thw!;
    const pads = grids.reduce((s, [t, h, w]) => s + t * h * w, 0) / out.merge_size ** 2;
    const counts: Record<string, number> = {};
    for (const id of ids) {
      const name = names.get(id);
      if (name !== undefined) counts[name] = (counts[name] ?? 0) + 1;
    }
    assert.equal(grids.length, 1, 'one screenshot');
    assert.deepEqual(
      counts,
      {
        '<|im_start|>': messages + 1,
        '<|im_end|>': messages,
        '<|vision_start|>': grids.length,
        '<|vision_end|>': grids.length,
        '<|image_pad|>': pads,
      },
      `${where}: added tokens in the encoded prompt`,
    );
  }
});

test('the colocated learner samples on the step-2 prompt and answers (a spelled image pad used to wedge it)', { timeout: 120_000 }, async () => {
  const { steps } = await episode();
  const taskQueue = `prompt-integrity-${Date.now().toString(36)}`;
  const connection = await NativeConnection.connect({ address: stack.address });
  try {
    const worker = await Worker.create({
      connection,
      namespace: stack.namespace,
      taskQueue,
      workflowsPath: require.resolve('../test-workflows/sample-prompt'),
    });
    const out = await worker
      .runUntil(
        stack.client.workflow.execute(samplePrompt, {
          taskQueue,
          workflowId: taskQueue,
          args: [{ runId: 'prompt-integrity', promptRef: steps[1].promptRef, gpuTaskQueue: stack.gpuQueue, timeout: `${SAMPLE_TIMEOUT_S}s` }],
        }),
      )
      .catch((err: unknown) => {
        const causes: string[] = [];
        for (let e = err as { message?: string; cause?: unknown } | undefined; e; e = e.cause as typeof e) causes.push(String(e.message));
        throw new Error(`sample_actions on the step-2 prompt did not answer within ${SAMPLE_TIMEOUT_S} s: ${causes.join(' <- ')}`);
      });
    assert.equal(out.completions.length, 2);
    assert.equal(out.version, 0);
  } finally {
    await connection.close();
  }
});
