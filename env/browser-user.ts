import { execFileSync } from 'node:child_process';
import { accessSync, chmodSync, chownSync, constants as fsConstants, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/**
 * Chromium refuses its sandbox to a browser started as root, and a renderer without it is one exploit away from
 * the worker (its files, its network, root in a container). A worker running as root (a developer box, CI,
 * `./launch.sh` as root) therefore starts Chromium as an unprivileged account, `HALO_BROWSER_USER` (a user
 * name, default `nobody`), through util-linux's `setpriv`: the renderers then run sandboxed as they do in the
 * worker image. `HALO_BROWSER_USER=root` keeps the old, unsandboxed launch (with a warning at start).
 */
export const DEFAULT_BROWSER_USER = 'nobody';
const SETPRIV_PATHS = ['/usr/bin/setpriv', '/bin/setpriv'];

export interface BrowserUser {
  name: string;
  uid: number;
  gid: number;
}

/** How a root worker launches Chromium: a wrapper executable that drops to `user`, and folders that user owns. */
export interface DroppedLaunch {
  user: BrowserUser;
  /** Give this to Playwright as the executable: it owns Playwright's profile folder over to `user`, then execs Chromium as `user`. */
  executablePath: string;
  /** Downloads land here (Playwright's default folder belongs to root). */
  downloadsPath: string;
}

/** The account's ids (`id -u`, `id -g`), or an Error that names the account and the variable. */
export function lookUpUser(name: string): BrowserUser {
  try {
    const uid = Number(execFileSync('id', ['-u', name], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim());
    const gid = Number(execFileSync('id', ['-g', name], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim());
    if (!Number.isInteger(uid) || !Number.isInteger(gid)) throw new Error('no ids');
    return { name, uid, gid };
  } catch {
    throw new Error(`HALO_BROWSER_USER=${name}: no such user on this machine (a user name, e.g. nobody; root keeps Chromium unsandboxed)`);
  }
}

function setprivPath(): string | undefined {
  for (const p of SETPRIV_PATHS) {
    try {
      accessSync(p, fsConstants.X_OK);
      return p;
    } catch {
      // not here
    }
  }
  return undefined;
}

const quote = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;

const prepared = new Map<string, DroppedLaunch>();

/**
 * For a worker running as `uid`: undefined when it is not root (Chromium keeps its sandbox by itself), else the
 * wrapper that starts `chromium` as HALO_BROWSER_USER. A worker that asked for root, or a machine without setpriv,
 * gets undefined with `warn` called once saying what that costs; an unknown user is an Error.
 */
export function dropPrivileges(
  chromium: string,
  uid: number | undefined,
  env: NodeJS.ProcessEnv = process.env,
  warn: (msg: string) => void = (m) => process.emitWarning(m),
): DroppedLaunch | undefined {
  if (uid !== 0) return undefined;
  const name = env.HALO_BROWSER_USER?.trim() || DEFAULT_BROWSER_USER;
  const key = `${name}\0${chromium}`;
  const done = prepared.get(key);
  if (done) return done;
  if (name === 'root') {
    warnOnce(warn, 'HALO_BROWSER_USER=root: Chromium runs as root without its sandbox; a renderer exploit gets the worker');
    return undefined;
  }
  const user = lookUpUser(name);
  if (user.uid === 0) throw new Error(`HALO_BROWSER_USER=${name} is uid 0: name an unprivileged user (or root, to run unsandboxed knowingly)`);
  const setpriv = setprivPath();
  if (!setpriv) {
    warnOnce(warn, `running as root and setpriv (util-linux) is not installed: Chromium runs as root without its sandbox; install util-linux or run the worker as a non-root user`);
    return undefined;
  }
  // Private to root (0711): the wrapper cannot be swapped by another user; the home inside belongs to the browser user.
  const dir = mkdtempSync(join(tmpdir(), 'halo-browser-'));
  chmodSync(dir, 0o711);
  const home = join(dir, 'home');
  const downloadsPath = join(dir, 'downloads');
  for (const d of [home, downloadsPath]) {
    mkdirSync(d, { mode: 0o700 });
    chownSync(d, user.uid, user.gid);
  }
  const executablePath = join(dir, 'chromium');
  writeFileSync(
    executablePath,
    [
      '#!/bin/sh',
      '# Playwright makes the profile folder as root: hand it to the browser user, then run Chromium as that user.',
      'for a in "$@"; do',
      '  case "$a" in',
      `    --user-data-dir=*) chown -R ${user.uid}:${user.gid} "\${a#--user-data-dir=}" || exit 1 ;;`,
      '  esac',
      'done',
      `HOME=${quote(home)}`,
      'export HOME',
      `exec ${quote(setpriv)} --reuid=${user.uid} --regid=${user.gid} --clear-groups --inh-caps=-all --bounding-set=-all -- ${quote(chromium)} "$@"`,
      '',
    ].join('\n'),
    { mode: 0o755 },
  );
  const out = { user, executablePath, downloadsPath };
  prepared.set(key, out);
  process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
  return out;
}

const warned = new Set<string>();
function warnOnce(warn: (msg: string) => void, msg: string): void {
  if (warned.has(msg)) return;
  warned.add(msg);
  warn(msg);
}
