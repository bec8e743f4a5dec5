import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { launchChromium, resolveChromiumPath } from '../../env/browser';
import { dropPrivileges } from '../../env/browser-user';
import { cmdline, descendants } from '../../testing/process-tree';

// Chromium refuses its sandbox to root. A worker running as root (CI, a developer box, ./launch.sh as root) must
// still get sandboxed renderers: the browser runs as an unprivileged user.

/** Every Chromium process under `root`, with its uid, command line and seccomp mode. */
function chromiumTree(root: number): { pid: number; uid: number; cmdline: string; seccomp: number }[] {
  return descendants(root).flatMap((pid) => {
    const cmd = cmdline(pid);
    if (cmd === undefined || !/chrom/i.test(cmd)) return [];
    try {
      const status = readFileSync(`/proc/${pid}/status`, 'utf8');
      const uid = Number(/^Uid:\s+(\d+)/m.exec(status)?.[1]);
      const seccomp = Number(/^Seccomp:\s+(\d+)/m.exec(status)?.[1] ?? -1);
      return [{ pid, uid, cmdline: cmd, seccomp }];
    } catch {
      return []; // exited meanwhile
    }
  });
}

test('Chromium started by this worker runs as a non-root user with its renderers sandboxed', async () => {
  const browser = await launchChromium();
  try {
    const page = await browser.newPage();
    await page.setContent('<p id="p">a page from the web</p>');
    assert.equal(await page.textContent('#p'), 'a page from the web');
    const tree = chromiumTree(process.pid);
    const renderers = tree.filter((p) => p.cmdline.includes('--type=renderer'));
    assert.ok(tree.length >= 2 && renderers.length >= 1, `browser and a renderer expected, found ${JSON.stringify(tree.map((p) => p.cmdline.slice(0, 80)))}`);
    for (const p of tree) {
      assert.notEqual(p.uid, 0, `Chromium process ${p.pid} runs as root: ${p.cmdline.slice(0, 120)}`);
      assert.ok(!p.cmdline.includes('--no-sandbox'), `Chromium process ${p.pid} was started with --no-sandbox`);
    }
    // The renderer sandbox's seccomp-bpf filter (mode 2) is on in every renderer.
    for (const r of renderers) assert.equal(r.seccomp, 2, `renderer ${r.pid} has no seccomp filter (mode ${r.seccomp})`);
  } finally {
    await browser.close();
  }
});

test('as root: HALO_BROWSER_USER picks the account, an unknown one is a clear error, root opts out with a warning', {
  skip: process.getuid?.() !== 0 && 'the worker is not root here',
}, () => {
  const chromium = resolveChromiumPath();
  assert.equal(dropPrivileges(chromium, 1000, {}), undefined, 'a non-root worker needs no drop');
  const nobody = dropPrivileges(chromium, 0, {});
  assert.equal(nobody?.user.name, 'nobody');
  assert.notEqual(nobody?.user.uid, 0);
  assert.throws(() => dropPrivileges(chromium, 0, { HALO_BROWSER_USER: 'no-such-user-halo' }), /HALO_BROWSER_USER=no-such-user-halo: no such user/);
  const warnings: string[] = [];
  assert.equal(
    dropPrivileges(chromium, 0, { HALO_BROWSER_USER: 'root' }, (m) => warnings.push(m)),
    undefined,
  );
  assert.match(warnings.join('\n'), /without its sandbox/);
});
