import { execFile } from 'node:child_process';
import { lookup } from 'node:dns/promises';
import { existsSync, statfsSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { startMiniwobServer, type MiniwobServer } from '../env/miniwob-server';
import { firstLine } from '../env/page-actions';
import { checkSiteHealth } from '../env/real-site';
import { EXPECTED_AGISDK_VERSION, findAgisdk, listRealTasks } from '../env/real-tasks';
import type { HaloConfig } from '../lib/config/config';
import type { DoctorCheck } from './doctor-check';
import { REPO_ROOT } from './processes';

// `halo doctor` on this machine: the browser, the task pages and sites, the GPU and the disk.

const GiB = 1024 ** 3;

export async function chromiumCheck(): Promise<DoctorCheck> {
  const name = 'Chromium launches';
  try {
    // Loaded here, not with the CLI: playwright-core is half a second of every `halo` command's start. A require:
    // the CLI runs under tsx's CommonJS hook, where import() of a .ts path does not resolve.
    const { launchChromium } = require('../env/browser') as typeof import('../env/browser');
    const browser = await launchChromium({ timeoutMs: 30_000 });
    try {
      const version = browser.version();
      const page = await browser.newPage();
      await page.setContent('<p>ok</p>');
      return { id: 'chromium', name, status: 'pass', detail: `Chromium ${version}` };
    } finally {
      await browser.close();
    }
  } catch (err) {
    return {
      id: 'chromium',
      name,
      status: 'fail',
      detail: firstLine((err as Error).message),
      fix: "./launch.sh setup installs Debian's chromium; elsewhere set HALO_CHROMIUM to a Chromium binary (docs/setup.md: Ubuntu 22.04)",
    };
  }
}

export async function miniwobCheck(): Promise<DoctorCheck> {
  const name = 'MiniWoB++ pages';
  const fix = './launch.sh setup installs miniwob==1.1.0 into .venv; or set HALO_MINIWOB_HTML to its html/ folder';
  let server: MiniwobServer;
  try {
    server = await startMiniwobServer();
  } catch (err) {
    return { id: 'miniwob', name, status: 'fail', detail: firstLine((err as Error).message), fix };
  }
  try {
    const res = await fetch(`${server.baseUrl}/miniwob/click-button.html`, { signal: AbortSignal.timeout(5000) });
    const text = await res.text();
    if (res.status !== 200 || !text.includes('<')) return { id: 'miniwob', name, status: 'fail', detail: `click-button.html answered HTTP ${res.status}`, fix };
    return { id: 'miniwob', name, status: 'pass', detail: `served from ${server.root}` };
  } catch (err) {
    return { id: 'miniwob', name, status: 'fail', detail: firstLine((err as Error).message), fix };
  } finally {
    await server.close();
  }
}

export async function agisdkCheck(): Promise<DoctorCheck> {
  const name = 'agisdk (REAL tasks)';
  const fix = `./launch.sh setup (pip install --no-deps agisdk==${EXPECTED_AGISDK_VERSION} into .venv)`;
  try {
    const { version, dir } = findAgisdk();
    if (version !== EXPECTED_AGISDK_VERSION) {
      return { id: 'agisdk', name, status: 'warn', detail: `agisdk ${version} at ${dir}; the project pins ${EXPECTED_AGISDK_VERSION}`, fix };
    }
    return { id: 'agisdk', name, status: 'pass', detail: `agisdk ${version}` };
  } catch (err) {
    return { id: 'agisdk', name, status: 'fail', detail: firstLine((err as Error).message), fix };
  }
}

export async function realSitesCheck(cfg: HaloConfig, env: NodeJS.ProcessEnv, timeoutMs: number): Promise<DoctorCheck> {
  const name = 'REAL sites reachable';
  const needed = cfg.episode.env === 'real';
  let origins: string[];
  if (env.HALO_REAL_ORIGIN) origins = [new URL(env.HALO_REAL_ORIGIN).origin];
  else {
    try {
      origins = [...new Set(listRealTasks().map((t) => t.origin))].sort();
    } catch (err) {
      return { id: 'real', name, status: 'skip', detail: `no REAL task list: ${firstLine((err as Error).message)}`, fix: 'fix the agisdk check first' };
    }
  }
  // Offline (no DNS): said so, not failed.
  const host = new URL(origins[0]).hostname;
  if (!/^(\d+\.){3}\d+$|^localhost$|^\[/.test(host)) {
    try {
      await Promise.race([lookup(host), new Promise((_, rej) => setTimeout(() => rej(Object.assign(new Error('DNS timeout'), { code: 'ETIMEOUT' })), timeoutMs))]);
    } catch (err) {
      return {
        id: 'real',
        name,
        status: 'skip',
        detail: `offline: ${host} does not resolve (${(err as NodeJS.ErrnoException).code ?? (err as Error).message}); REAL sites were not checked`,
        fix: needed ? 'REAL training needs internet access to the sites (or HALO_REAL_ORIGIN pointing at a mirror)' : undefined,
      };
    }
  }
  const results = await Promise.all(
    origins.map((o) =>
      checkSiteHealth(o, { attempts: 1, timeoutMs }).then(
        () => null,
        (err: Error) => `${o}: ${firstLine(err.message)}`,
      ),
    ),
  );
  const bad = results.filter((r): r is string => r !== null);
  if (bad.length === 0) return { id: 'real', name, status: 'pass', detail: `${origins.length} site(s) answer` };
  return {
    id: 'real',
    name,
    status: needed ? 'fail' : 'warn',
    detail: `${bad.length} of ${origins.length} unreachable: ${bad.join('; ')}`,
    fix: `check the network (proxy, firewall)${needed ? '' : '; this config trains MiniWoB++, so REAL is not needed for it'}`,
  };
}

export function gpuCheck(): Promise<DoctorCheck> {
  const name = 'GPU memory';
  return new Promise((done) => {
    execFile('nvidia-smi', ['--query-gpu=index,name,memory.free,memory.total', '--format=csv,noheader,nounits'], { timeout: 15_000 }, (err, stdout) => {
      if (err) {
        const absent = (err as NodeJS.ErrnoException).code === 'ENOENT';
        done(
          absent
            ? { id: 'gpu', name, status: 'skip', detail: 'no nvidia-smi: no NVIDIA GPU on this machine (the learner runs on the CPU)' }
            : { id: 'gpu', name, status: 'fail', detail: `nvidia-smi failed: ${firstLine(err.message)}`, fix: 'check the NVIDIA driver (nvidia-smi)' },
        );
        return;
      }
      const gpus = stdout
        .trim()
        .split('\n')
        .filter(Boolean)
        .map((l) => {
          const [index, gpuName, free, total] = l.split(',').map((x) => x.trim());
          return { index, gpuName, free: Number(free), total: Number(total) };
        });
      const detail = gpus.map((g) => `GPU ${g.index} ${g.gpuName}: ${(g.free / 1024).toFixed(1)} of ${(g.total / 1024).toFixed(1)} GiB free`).join('; ');
      const low = gpus.some((g) => g.free < 1024);
      done(
        low
          ? { id: 'gpu', name, status: 'warn', detail, fix: 'another process holds the GPU (nvidia-smi lists it); vLLM and the learner share one GPU by --gpu-memory-utilization' }
          : { id: 'gpu', name, status: 'pass', detail },
      );
    });
  });
}

export function diskCheck(cfg: HaloConfig): DoctorCheck {
  const name = 'free disk';
  let dir = resolve(REPO_ROOT, cfg.stack.home);
  while (!existsSync(dir) && dirname(dir) !== dir) dir = dirname(dir);
  try {
    const s = statfsSync(dir);
    const free = (Number(s.bavail) * Number(s.bsize)) / GiB;
    const detail = `${free.toFixed(1)} GiB free at ${dir}`;
    if (free < 2) return { id: 'disk', name, status: 'fail', detail, fix: 'free some space: npx halo gc drops old blobs and adapters' };
    if (free < 20) return { id: 'disk', name, status: 'warn', detail, fix: 'the 8B model takes about 17 GiB in the Hugging Face cache; npx halo gc drops old blobs and adapters' };
    return { id: 'disk', name, status: 'pass', detail };
  } catch (err) {
    return { id: 'disk', name, status: 'skip', detail: firstLine((err as Error).message) };
  }
}
