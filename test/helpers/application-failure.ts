import assert from 'node:assert/strict';
import { ApplicationFailure } from '@temporalio/common';

/**
 * The ApplicationFailure an activity called directly rejects with: outside a worker its `type`,
 * `nonRetryable` and `details` are what Temporal would record. Fails the test when `p` resolves or
 * rejects with anything else.
 */
export async function failureOf(p: Promise<unknown>): Promise<ApplicationFailure> {
  try {
    await p;
  } catch (err) {
    assert.ok(err instanceof ApplicationFailure, `expected an ApplicationFailure, got ${String(err)}`);
    return err;
  }
  assert.fail('expected the call to fail');
}
