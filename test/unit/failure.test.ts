import { test } from 'node:test';
import assert from 'node:assert/strict';
import { WorkflowFailedError } from '@temporalio/client';
import { ActivityFailure, ApplicationFailure, ChildWorkflowFailure, DefaultFailureConverter, defaultPayloadConverter, RetryState, TerminatedFailure } from '@temporalio/common';
import { ConfigError } from '../../lib/config/config';
import { describeFailure, EXIT, fixIn, formatFailure, reportError, RunFailedError } from '../../client/failure';

const converter = new DefaultFailureConverter();
/** Through Temporal's wire form and back, as a client receives a workflow's failure. */
const wire = (err: Error) => converter.failureToError(converter.errorToFailure(err, defaultPayloadConverter), defaultPayloadConverter);

function trainingRunFailure(): WorkflowFailedError {
  const root = ApplicationFailure.create({
    message: 'policy server http://x/v1 (model m) answered without the sampled token ids. The learner trains on them; to sample without them, set policy.tokenIds: off (ratio 1)',
    type: 'PolicyTokenIdsMissing',
    nonRetryable: true,
  });
  const activity = new ActivityFailure('Activity task failed', 'samplePolicy', '7', RetryState.NON_RETRYABLE_FAILURE, 'id', root);
  const child = new ChildWorkflowFailure('default', { workflowId: 'run-it1-ep0', runId: 'r' }, 'episode', RetryState.NON_RETRYABLE_FAILURE, activity);
  const run = ApplicationFailure.create({ message: '2 of 2 episodes of iteration 1 failed', type: 'TooManyFailures', nonRetryable: true, cause: child });
  return new WorkflowFailedError('Workflow execution failed', wire(run), RetryState.NON_RETRYABLE_FAILURE);
}

test('the walk reaches the root through the run, the child workflow and the activity', () => {
  const f = describeFailure(trainingRunFailure(), { workflowId: 'run', workflowType: 'trainGrpo' });
  assert.deepEqual(f.children, [{ workflowId: 'run-it1-ep0', workflowType: 'episode' }]);
  assert.equal(f.activity?.activityType, 'samplePolicy');
  assert.equal(f.type, 'PolicyTokenIdsMissing');
  assert.match(f.message, /answered without the sampled token ids/);
  assert.equal(f.fix, 'to sample without them, set policy.tokenIds: off (ratio 1)');
  assert.deepEqual(f.outcome, { type: 'TooManyFailures', message: '2 of 2 episodes of iteration 1 failed' });
  assert.equal(f.category, 'config');
  assert.equal(f.exitCode, EXIT.config);
  const text = formatFailure(f);
  assert.match(text, /where: +workflow run \(trainGrpo\) → child workflow run-it1-ep0 \(episode\) → activity samplePolicy/);
  assert.match(text, /error: +PolicyTokenIdsMissing \(non-retryable\)/);
  assert.match(text, /fix: +to sample without them, set policy\.tokenIds: off/);
});

test('a retryable root is a runtime failure; a known type without a fix in its message gets one', () => {
  const root = ApplicationFailure.retryable('policy server http://127.0.0.1:9/v1 unreachable: Connection error.', 'PolicyServerUnreachable');
  const activity = new ActivityFailure('Activity task failed', 'samplePolicy', '2', RetryState.MAXIMUM_ATTEMPTS_REACHED, 'id', root);
  const f = describeFailure(new WorkflowFailedError('Workflow execution failed', wire(activity), RetryState.NON_RETRYABLE_FAILURE));
  assert.equal(f.category, 'runtime');
  assert.equal(f.exitCode, EXIT.runtime);
  assert.match(f.fix ?? '', /start the policy server/);
  assert.match(formatFailure(f), /activity samplePolicy \(after its last attempt\)/);
});

test('a terminated workflow says so; a config-looking type that may be retried is not a config error', () => {
  const t = describeFailure(new WorkflowFailedError('Workflow execution terminated', new TerminatedFailure('operator stopped it'), RetryState.NON_RETRYABLE_FAILURE));
  assert.equal(t.type, 'Terminated');
  assert.equal(t.message, 'operator stopped it');
  const retryable = describeFailure(new WorkflowFailedError('x', wire(ApplicationFailure.retryable('bad', 'InvalidConfig')), RetryState.NON_RETRYABLE_FAILURE));
  assert.equal(retryable.category, 'runtime');
});

test('fixIn finds the clause that says what to do, and nothing in a message that names no fix', () => {
  assert.equal(fixIn('lora rank 512 too large. Lower train.loraRank to 64 or less.'), 'Lower train.loraRank to 64 or less');
  assert.equal(fixIn('the page crashed'), undefined);
});

test('reportError: the failure as text, with --json as an error object, and the exit code of its kind', () => {
  const out: string[] = [];
  const err: string[] = [];
  const print = { out: (s: string) => out.push(s), err: (s: string) => err.push(s) };
  const code = reportError(new RunFailedError(describeFailure(trainingRunFailure()), 'start a new run'), true, print);
  assert.equal(code, EXIT.config);
  const json = JSON.parse(out[0]);
  assert.equal(json.error.type, 'PolicyTokenIdsMissing');
  assert.equal(json.error.activity.activityType, 'samplePolicy');
  assert.equal(json.error.children[0].workflowId, 'run-it1-ep0');
  assert.match(err.join('\n'), /start a new run/);
  assert.equal(reportError(new ConfigError('policy.temperature: too small'), false, print), EXIT.config);
  assert.equal(reportError(new Error('no Temporal server'), false, print), EXIT.runtime);
});
