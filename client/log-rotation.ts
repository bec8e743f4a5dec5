import { closeSync, fstatSync, openSync, renameSync, rmSync, writeSync } from 'node:fs';

/** How big a background process's log may grow: each file at most `maxBytes`, at most `files` files. */
export interface LogCap {
  maxBytes: number;
  files: number;
}

export const DEFAULT_LOG_MAX_MB = 50;
export const DEFAULT_LOG_FILES = 3;

/** The cap from HALO_LOG_MAX_MB (a positive number of MiB) and HALO_LOG_FILES (a whole number ≥ 1). */
export function logCapFromEnv(env: NodeJS.ProcessEnv = process.env): LogCap {
  const mbText = env.HALO_LOG_MAX_MB?.trim() || String(DEFAULT_LOG_MAX_MB);
  const filesText = env.HALO_LOG_FILES?.trim() || String(DEFAULT_LOG_FILES);
  const mb = Number(mbText);
  const files = Number(filesText);
  const maxBytes = Math.floor(mb * 1024 * 1024);
  if (!Number.isFinite(mb) || maxBytes < 1) throw new Error(`HALO_LOG_MAX_MB must be a positive number of MiB (at least one byte), got '${mbText}'`);
  if (!Number.isInteger(files) || files < 1) throw new Error(`HALO_LOG_FILES must be a whole number of at least 1, got '${filesText}'`);
  return { maxBytes, files };
}

/**
 * Appends to `file` and rotates it logrotate-style (`file` → `file.1` → … → `file.<files-1>`, the oldest
 * dropped) before a write would take it past `maxBytes`. A chunk is split at the cap rather than written whole,
 * so no file ever exceeds it, whatever the process writes in one go.
 */
export class RotatingLog {
  private fd: number;
  private size: number;

  constructor(
    readonly file: string,
    readonly cap: LogCap,
  ) {
    this.fd = openSync(file, 'a');
    this.size = fstatSync(this.fd).size;
  }

  write(chunk: Buffer): void {
    let at = 0;
    while (at < chunk.length) {
      if (this.size >= this.cap.maxBytes) this.rotate();
      const n = Math.min(chunk.length - at, this.cap.maxBytes - this.size);
      let done = 0;
      while (done < n) done += writeSync(this.fd, chunk, at + done, n - done);
      this.size += n;
      at += n;
    }
  }

  close(): void {
    closeSync(this.fd);
  }

  private rotate(): void {
    closeSync(this.fd);
    if (this.cap.files === 1) {
      rmSync(this.file, { force: true });
    } else {
      rmSync(`${this.file}.${this.cap.files - 1}`, { force: true });
      for (let i = this.cap.files - 2; i >= 1; i--) renameIfPresent(`${this.file}.${i}`, `${this.file}.${i + 1}`);
      renameIfPresent(this.file, `${this.file}.1`);
    }
    this.fd = openSync(this.file, 'a');
    this.size = 0;
  }
}

function renameIfPresent(from: string, to: string): void {
  try {
    renameSync(from, to);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
  }
}
