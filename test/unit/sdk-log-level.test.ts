import { test } from 'node:test';
import assert from 'node:assert/strict';
import { sdkLogLevel } from '../../workers/runtime';

test('HALO_TEMPORAL_LOG_LEVEL sets how much of the SDK and Core reaches the worker log: WARN unless set, any case', () => {
  assert.equal(sdkLogLevel({}), 'WARN');
  assert.equal(sdkLogLevel({ HALO_TEMPORAL_LOG_LEVEL: ' ' }), 'WARN');
  assert.equal(sdkLogLevel({ HALO_TEMPORAL_LOG_LEVEL: 'info' }), 'INFO');
  assert.equal(sdkLogLevel({ HALO_TEMPORAL_LOG_LEVEL: 'TRACE' }), 'TRACE');
  assert.throws(() => sdkLogLevel({ HALO_TEMPORAL_LOG_LEVEL: 'verbose' }), /HALO_TEMPORAL_LOG_LEVEL "verbose": one of TRACE, DEBUG, INFO, WARN, ERROR/);
});
