/**
 * `node --import tsx client/log-sink.ts <file> <maxBytes> <files>`: copies its stdin into a RotatingLog until
 * every writer has closed it. `halo up` gives each background process's stdout and stderr to one of these, so
 * the cap holds for a process that runs for weeks and for everything it starts (Chromium, vLLM's engines).
 */
import { RotatingLog } from './log-rotation';

const [file, maxBytesText, filesText] = process.argv.slice(2);
const maxBytes = Number(maxBytesText);
const files = Number(filesText);
if (!file || !Number.isInteger(maxBytes) || maxBytes < 1 || !Number.isInteger(files) || files < 1) {
  console.error('usage: log-sink.ts <file> <maxBytes ≥ 1> <files ≥ 1>');
  process.exit(2);
}
const log = new RotatingLog(file, { maxBytes, files });
// The sink outlives a Ctrl-C or SIGTERM aimed at the stack: it stops when the last writer closes the pipe,
// so a process's last words on shutdown still reach its log.
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(sig, () => {});
process.stdin.on('data', (chunk: Buffer) => log.write(chunk));
process.stdin.on('end', () => log.close());
