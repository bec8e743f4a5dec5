import { accessSync, constants as fsConstants, statSync } from 'node:fs';
import { delimiter, join } from 'node:path';
import { chromium, type Browser } from 'playwright-core';
import { dropPrivileges } from './browser-user';
import { browserEnv } from './child-env';
import { startEgressProxy, type EgressProxy, type EgressProxyOptions } from './private-network';

/** Viewport every environment page is created with; screenshots are exactly this size. */
export const DEFAULT_VIEWPORT = { width: 1280, height: 720 } as const;

export const DEFAULT_CHROMIUM_PATH = '/usr/bin/chromium';
/**
 * Debian's `chromium-headless-shell`: the same Chromium build without the browser's UI, what Playwright itself launches
 * for headless. The binary itself, not /usr/bin's shell wrapper around it (the wrapper does not exec, so it would sit
 * between Playwright and the browser it signals).
 */
export const HEADLESS_SHELL_PATH = '/usr/lib/chromium/chromium-headless-shell';
/** Ubuntu ships Chromium as a snap only (22.04 and later). */
export const SNAP_CHROMIUM_PATH = '/snap/bin/chromium';

/** Where `npx playwright-core install chromium` puts its build (undefined when Playwright cannot say). */
function playwrightChromium(): string | undefined {
  try {
    return chromium.executablePath();
  } catch {
    return undefined;
  }
}

/**
 * The machine has no network. Without the background-networking family of flags Chromium keeps retrying
 * closed connections (component updates, sync, safe browsing...), which costs CPU and log noise.
 */
export const CHROMIUM_ARGS: readonly string[] = [
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--disable-default-apps',
  '--disable-dev-shm-usage',
];

/**
 * Whether Chromium keeps its own sandbox (user namespaces + seccomp-bpf around every renderer) when it runs as
 * `uid`: not as root, where Chromium refuses to run sandboxed. A worker running as root therefore starts the
 * browser as an unprivileged user (env/browser-user.ts); the worker image runs as one already.
 */
export function chromiumSandboxed(uid: number | undefined = process.getuid?.()): boolean {
  return uid !== 0;
}

/** Added by Playwright to every headless launch. */
export const HIDE_SCROLLBARS = '--hide-scrollbars';

export interface LaunchChromiumOptions {
  /** Overrides HALO_CHROMIUM and the default search. */
  executablePath?: string;
  /** Default true. */
  headless?: boolean;
  /** Appended after CHROMIUM_ARGS. */
  extraArgs?: string[];
  /** Launch timeout in ms (default 60 s). */
  timeoutMs?: number;
  /**
   * Keep Playwright's headless `--hide-scrollbars` (default false). Official MiniWoB++ (Selenium) shows
   * scrollbars, and they take 15 px of every scrollable box; the official REAL harness (agisdk, a plain
   * Playwright launch) hides them, so REAL sessions ask for true.
   */
  hideScrollbars?: boolean;
  /**
   * Send all of the browser's traffic through an egress proxy of this process (env/private-network.ts) that
   * refuses private, loopback and link-local destinations other than the origins allowed on it (RealEnv
   * allows its site's): unlike Playwright routes it also covers redirect hops, WebSockets and DNS
   * rebinding. REAL browsers want it; a MiniWoB browser (its pages come from a loopback server) does not.
   * An object passes options to the proxy (tests: its resolver).
   */
  egressGuard?: boolean | EgressProxyOptions;
  /** Playwright's slowMo: a pause after every browser operation (agisdk's REAL harness: 1000 ms). */
  slowMo?: number;
}

const egressProxies = new WeakMap<Browser, EgressProxy>();

/** The egress proxy a browser was launched with (launchChromium's `egressGuard`), if any. */
export function egressProxyOf(browser: Browser | null | undefined): EgressProxy | undefined {
  return browser ? egressProxies.get(browser) : undefined;
}

function isExecutableFile(path: string): boolean {
  try {
    if (!statSync(path).isFile()) return false;
    accessSync(path, fsConstants.X_OK);
    return true;
  } catch {
    return false;
  }
}

function chromiumNotFound(where: string): Error {
  return new Error(
    `Chromium not found at ${where}; install Debian's chromium (apt-get install chromium), on Ubuntu the snap or Playwright's build (npx playwright-core install --with-deps chromium), or set HALO_CHROMIUM`,
  );
}

/**
 * Which Chromium binary to use: an explicit path (option or HALO_CHROMIUM) must exist; otherwise
 * /usr/bin/chromium, otherwise `chromium` (or `chromium-browser`) on PATH, otherwise the snap's
 * /snap/bin/chromium (Ubuntu), otherwise Playwright's own download (`npx playwright-core install chromium`).
 */
export function resolveChromiumPath(explicit?: string): string {
  const chosen = explicit ?? process.env.HALO_CHROMIUM;
  if (chosen !== undefined && chosen !== '') {
    if (!isExecutableFile(chosen)) throw chromiumNotFound(chosen);
    return chosen;
  }
  if (isExecutableFile(DEFAULT_CHROMIUM_PATH)) return DEFAULT_CHROMIUM_PATH;
  for (const dir of (process.env.PATH ?? '').split(delimiter)) {
    if (!dir) continue;
    for (const name of ['chromium', 'chromium-browser']) {
      const candidate = join(dir, name);
      if (isExecutableFile(candidate)) return candidate;
    }
  }
  if (isExecutableFile(SNAP_CHROMIUM_PATH)) return SNAP_CHROMIUM_PATH;
  const playwrights = playwrightChromium();
  if (playwrights && isExecutableFile(playwrights)) return playwrights;
  throw chromiumNotFound(`${DEFAULT_CHROMIUM_PATH} (nor chromium on PATH, ${SNAP_CHROMIUM_PATH} or Playwright's download)`);
}

/**
 * The binary a launch uses: HALO_CHROMIUM or an explicit path when given; else, headless, the headless shell where it
 * is installed: full Chromium opens a browser window with its UI for every context (each new context costs about
 * 4x the CPU: bench/browser-launch.ts); else resolveChromiumPath's search.
 */
export function resolveLaunchPath(explicit: string | undefined, headless: boolean, shell = HEADLESS_SHELL_PATH): string {
  const chosen = explicit ?? process.env.HALO_CHROMIUM;
  if (headless && (chosen === undefined || chosen === '') && isExecutableFile(shell)) return shell;
  return resolveChromiumPath(explicit);
}

/**
 * Headless Chromium through playwright-core (there is no Playwright browser download on these machines),
 * with scrollbars unless `hideScrollbars`.
 */
export async function launchChromium(opts: LaunchChromiumOptions = {}): Promise<Browser> {
  const headless = opts.headless ?? true;
  const executablePath = resolveLaunchPath(opts.executablePath, headless);
  const workerUid = process.getuid?.();
  const dropped = dropPrivileges(executablePath, workerUid);
  const proxy = opts.egressGuard ? await startEgressProxy(opts.egressGuard === true ? {} : opts.egressGuard) : undefined;
  let browser: Browser;
  try {
    browser = await chromium.launch({
      executablePath: dropped?.executablePath ?? executablePath,
      headless,
      args: [...CHROMIUM_ARGS, ...(proxy?.chromiumArgs ?? []), ...(opts.extraArgs ?? [])],
      // Playwright adds --no-sandbox unless told otherwise.
      chromiumSandbox: chromiumSandboxed(dropped?.user.uid ?? workerUid),
      ...(dropped ? { downloadsPath: dropped.downloadsPath } : {}),
      // Playwright would hand Chromium the worker's whole environment.
      env: browserEnv(),
      ...(opts.hideScrollbars === true ? {} : { ignoreDefaultArgs: [HIDE_SCROLLBARS] }),
      timeout: opts.timeoutMs ?? 60_000,
      ...(opts.slowMo ? { slowMo: opts.slowMo } : {}),
    });
  } catch (err) {
    await proxy?.close();
    throw err;
  }
  if (proxy) {
    egressProxies.set(browser, proxy);
    browser.on('disconnected', () => void proxy.close());
  }
  return browser;
}
