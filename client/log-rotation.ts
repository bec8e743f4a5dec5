import { closeSync, fstatSync, ftruncateSync, openSync, readSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';

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
 * Rotates `file` once it holds more than `cap.maxBytes`, the way logrotate's copytruncate does: its bytes move
 * to `file.1` (what was there to `file.2`, …, the oldest dropped) and `file` is cut to nothing in place. The
 * process writing it keeps its descriptor (opened for appending, so its next write lands at the new end):
 * nothing about its output changes, and it cannot be hurt by whoever rotates. Bytes that arrived late are
 * split into pieces of at most `maxBytes` from the end, so no rotated file is over the cap and only what
 * would be past `files` files is dropped. Returns whether it rotated.
 */
export function rotateIfOver(file: string, cap: LogCap): boolean {
  // Called on every change of the file: one stat when there is nothing to do.
  if ((statSync(file, { throwIfNoEntry: false })?.size ?? 0) <= cap.maxBytes) return false;
  let fd: number;
  try {
    fd = openSync(file, 'r+');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return false;
    throw err;
  }
  try {
    const stat = fstatSync(fd);
    let size = stat.size;
    if (size <= cap.maxBytes) return false;
    const keep = (cap.files - 1) * cap.maxBytes;
    let tail = readRange(fd, Math.max(0, size - keep), size);
    // The writer keeps writing while this reads: catch up until the size holds still, then cut at once, so
    // only what lands between that last look and the truncation is lost.
    for (let grown = fstatSync(fd).size; grown > size; grown = fstatSync(fd).size) {
      tail = Buffer.concat([tail, readRange(fd, size, grown)]);
      size = grown;
    }
    ftruncateSync(fd, 0);
    if (tail.length > keep) tail = tail.subarray(tail.length - keep);
    const pieces: Buffer[] = [];
    for (let end = tail.length; end > 0; end -= cap.maxBytes) pieces.push(tail.subarray(Math.max(0, end - cap.maxBytes), end));
    shiftRotated(file, pieces.length, cap.files);
    pieces.forEach((piece, i) => writeFileSync(`${file}.${i + 1}`, piece, { mode: stat.mode & 0o777 }));
    return true;
  } finally {
    closeSync(fd);
  }
}

/** Moves `file.i` to `file.(i+by)`, dropping those that would be past `file.(files-1)`. */
function shiftRotated(file: string, by: number, files: number): void {
  if (by === 0) return;
  for (let i = files - 1; i >= 1; i--) {
    if (i + by <= files - 1) renameIfPresent(`${file}.${i}`, `${file}.${i + by}`);
    else rmSync(`${file}.${i}`, { force: true });
  }
}

function readRange(fd: number, from: number, to: number): Buffer {
  const buf = Buffer.alloc(to - from);
  let done = 0;
  while (done < buf.length) {
    const n = readSync(fd, buf, done, buf.length - done, from + done);
    if (n === 0) return buf.subarray(0, done);
    done += n;
  }
  return buf;
}

function renameIfPresent(from: string, to: string): void {
  try {
    renameSync(from, to);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
  }
}
