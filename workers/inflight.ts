import { chmodSync, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { ApplicationFailure } from '@temporalio/common';
import { Client, Connection } from '@temporalio/client';
import type { ActivityInboundCallsInterceptor, ActivityExecuteInput, Next } from '@temporalio/worker';
import type { Context } from '@temporalio/activity';
import { connectOptions, type TemporalSettings } from '../host/connection';
import type { Logger } from '../host/log';

/**
 * The task tokens of the activities a worker process is running, on disk, so that its successor can fail
 * them at once (the Python learner does the same: workers/learner/halo_learner/inflight.py).
 *
 * A worker killed mid-activity leaves its attempts "started" until Temporal's heartbeat or start-to-close
 * timeout runs out (10 s for a browser step, a minute and more for a policy call); only then can the retry or
 * the episode's session rebuild begin. A process that starts in the same role on the same host reads the
 * ledgers of processes that are gone and fails their attempts through the task token
 * (RespondActivityTaskFailed), so the retry starts now. A ledger whose process still runs is left alone.
 *
 * One file per process, `<role>-<host>-<pid>.json`, readable by its owner only (0600 in a 0700 folder: a task
 * token is enough to complete or fail the activity).
 */

interface Entry {
  token: string;
  type: string;
  workflowId: string;
  attempt: number;
}

interface LedgerFile {
  pid: number;
  host: string;
  role: string;
  running: Entry[];
}

/** Error type of an attempt failed by the dead worker's successor (retryable). */
export const WORKER_RESTARTED = 'WorkerRestarted';

export function ledgerDir(home: string): string {
  return join(home, 'workers', 'inflight');
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

export class InflightLedger {
  private readonly running = new Map<string, Entry>();
  readonly file: string;

  constructor(
    private readonly dir: string,
    private readonly role: string,
  ) {
    this.file = join(dir, `${role}-${hostname()}-${process.pid}.json`);
  }

  begin(info: Context['info']): string {
    const token = Buffer.from(info.taskToken).toString('base64');
    this.running.set(token, { token, type: info.activityType, workflowId: info.workflowExecution?.workflowId ?? '', attempt: info.attempt });
    this.write();
    return token;
  }

  end(token: string): void {
    this.running.delete(token);
    this.write();
  }

  /** An activity interceptor that records every activity of this worker while it runs. */
  interceptor() {
    return (ctx: Context): { inbound: ActivityInboundCallsInterceptor } => ({
      inbound: {
        execute: async (input: ActivityExecuteInput, next: Next<ActivityInboundCallsInterceptor, 'execute'>) => {
          const token = this.begin(ctx.info);
          try {
            return await next(input);
          } finally {
            this.end(token);
          }
        },
      },
    });
  }

  private write(): void {
    if (this.running.size === 0) {
      rmSync(this.file, { force: true });
      return;
    }
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    chmodSync(this.dir, 0o700);
    const body: LedgerFile = { pid: process.pid, host: hostname(), role: this.role, running: [...this.running.values()] };
    const tmp = `${this.file}.tmp`;
    rmSync(tmp, { force: true });
    writeFileSync(tmp, JSON.stringify(body), { mode: 0o600, flag: 'wx' });
    chmodSync(tmp, 0o600);
    renameSync(tmp, this.file);
  }

  /** Ledgers of this role and host whose process is gone (our own pid counts as gone: we have written nothing yet). */
  orphans(): { file: string; ledger: LedgerFile | null }[] {
    if (!existsSync(this.dir)) return [];
    const prefix = `${this.role}-${hostname()}-`;
    const out: { file: string; ledger: LedgerFile | null }[] = [];
    for (const name of readdirSync(this.dir)) {
      // `<role>-<host>-<pid>.json` of this role and host only (a role or host name that merely starts the same does not count).
      if (!name.startsWith(prefix) || !/^\d+\.json$/.test(name.slice(prefix.length))) continue;
      const file = join(this.dir, name);
      let ledger: LedgerFile | null = null;
      try {
        ledger = JSON.parse(readFileSync(file, 'utf8')) as LedgerFile;
      } catch {
        // Unreadable (cut mid-write is impossible with the rename, so: damaged): dropped below.
      }
      if (ledger && ((ledger.host !== undefined && ledger.host !== hostname()) || (ledger.role !== undefined && ledger.role !== this.role))) continue;
      if (ledger && ledger.pid !== process.pid && alive(ledger.pid)) continue;
      out.push({ file, ledger });
    }
    return out;
  }

  /**
   * Fails every attempt that dead processes of this role left running on this host, then removes their
   * ledgers. Attempts that are over meanwhile (timed out, completed) are skipped. Returns how many were failed.
   */
  async releaseOrphans(settings: TemporalSettings, log: Logger): Promise<number> {
    const orphans = this.orphans();
    const entries = orphans.flatMap((o) => (o.ledger?.running ?? []).map((e) => ({ ...e, pid: o.ledger!.pid })));
    let failed = 0;
    if (entries.length > 0) {
      const connection = await Connection.connect(connectOptions(settings));
      try {
        const client = new Client({ connection, namespace: settings.namespace });
        for (const e of entries) {
          try {
            await client.activity.fail(
              Buffer.from(e.token, 'base64'),
              ApplicationFailure.retryable(
                `the ${this.role} process ${e.pid} died during this attempt; its successor failed it so that the retry starts now instead of after a timeout`,
                WORKER_RESTARTED,
              ),
            );
            failed++;
            log.warn({ activity: e.type, workflowId: e.workflowId, attempt: e.attempt, deadPid: e.pid }, 'failed an attempt a dead worker left running');
          } catch (err) {
            // Over already (timed out, completed, cancelled): nothing to release.
            log.info({ activity: e.type, workflowId: e.workflowId, err: (err as Error).message }, 'attempt of a dead worker already over');
          }
        }
      } finally {
        await connection.close();
      }
    }
    for (const o of orphans) rmSync(o.file, { force: true });
    return failed;
  }
}
