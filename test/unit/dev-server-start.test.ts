import { test } from 'node:test';
import assert from 'node:assert/strict';
import { appendFileSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { devServerStartFailure } from '../../client/temporal-server';

// A dev server whose port was taken between the free-port check and its bind dies at once; the stack starts
// another on a new port. The log is appended to across restarts, so only what this start wrote counts.
test('a dev server start failure is read from its own part of the log', () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-devlog-'));
  try {
    const log = join(dir, 'temporal.log');
    writeFileSync(log, 'time=… level=WARN msg="something harmless"\n');
    assert.equal(devServerStartFailure(log), undefined);
    appendFileSync(log, 'time=… level=ERROR msg="Failed to start gRPC listener" error="listen tcp 127.0.0.1:44033: bind: address already in use"\npanic: runtime error\n');
    assert.match(devServerStartFailure(log) ?? '', /address already in use/);
    // A later start of the same server (same log) is not judged by the earlier failure.
    const offset = statSync(log).size;
    assert.equal(devServerStartFailure(log, offset), undefined);
    appendFileSync(log, 'panic: runtime error: invalid memory address\n');
    assert.match(devServerStartFailure(log, offset) ?? '', /^panic:/);
    assert.equal(devServerStartFailure(join(dir, 'missing.log')), undefined);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
