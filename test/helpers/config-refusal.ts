import assert from 'node:assert/strict';
import { ConfigError, parseConfig } from '../../lib/config/config';

/** The message `parseConfig` refuses `raw` with (a ConfigError); fails the test when it takes it. */
export function configRefusal(raw: unknown): string {
  try {
    parseConfig(raw);
  } catch (err) {
    assert.ok(err instanceof ConfigError, String(err));
    return err.message;
  }
  return assert.fail('the config should be refused');
}
