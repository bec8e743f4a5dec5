import { test } from 'node:test';
import assert from 'node:assert/strict';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { resolveLaunchPath } from '../../env/browser';
import { withEnv } from '../helpers/with-env';

// Headless launches take the headless shell where it is installed; HALO_CHROMIUM or an explicit path always wins,
// and a headed launch never gets the shell (it has no window to show).
test('resolveLaunchPath: the headless shell for headless launches only, and never over HALO_CHROMIUM or an explicit path', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-browser-path-'));
  try {
    const executable = (name: string) => {
      const p = join(dir, name);
      writeFileSync(p, '#!/bin/sh\n');
      chmodSync(p, 0o755);
      return p;
    };
    const shell = executable('chromium-headless-shell');
    const chosen = executable('my-chromium');
    const missing = join(dir, 'not-installed');
    // A full Chromium to fall back on, found on PATH (as `chromium`) when /usr/bin has none.
    const onPath = executable('chromium');
    await withEnv({ HALO_CHROMIUM: undefined, PATH: `${dir}:${process.env.PATH ?? ''}` }, async () => {
      assert.equal(resolveLaunchPath(undefined, true, shell), shell);
      const full = resolveLaunchPath(undefined, false, shell);
      assert.notEqual(full, shell, 'a headed launch gets full Chromium');
      assert.ok(full === '/usr/bin/chromium' || full === onPath, full);
      assert.equal(resolveLaunchPath(undefined, true, missing), full, 'no shell installed: full Chromium');
      assert.equal(resolveLaunchPath(chosen, true, shell), chosen, 'an explicit path wins');
    });
    await withEnv({ HALO_CHROMIUM: chosen }, async () => {
      assert.equal(resolveLaunchPath(undefined, true, shell), chosen, 'HALO_CHROMIUM wins');
      assert.equal(resolveLaunchPath(undefined, false, shell), chosen);
    });
    await withEnv({ HALO_CHROMIUM: missing }, async () => {
      assert.throws(() => resolveLaunchPath(undefined, true, shell), /Chromium not found at .*not-installed/);
    });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
