import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { CreateBucketCommand, S3Client } from '@aws-sdk/client-s3';

const REPO_ROOT = resolve(__dirname, '..');

export interface LocalS3 {
  endpoint: string;
  bucket: string;
  /** The variables a process needs to use the bucket (HALO_STORE plus the standard S3 ones). */
  env(prefix?: string): Record<string, string>;
  client: S3Client;
  stop(): Promise<void>;
}

/**
 * An S3-compatible server on loopback for tests and benchmarks: moto's server mode (`moto[server]`, installed
 * into .venv by setup) on a port the OS picks, with one fresh bucket.
 */
export async function startLocalS3(opts: { bucket?: string } = {}): Promise<LocalS3> {
  const bin = join(REPO_ROOT, '.venv', 'bin', 'moto_server');
  if (!existsSync(bin)) throw new Error(`${bin} is missing: run ./launch.sh setup (it installs moto[server])`);
  const proc: ChildProcess = spawn(bin, ['-H', '127.0.0.1', '-p', '0'], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  const port = await new Promise<number>((ok, fail) => {
    const timer = setTimeout(() => fail(new Error(`moto_server did not start within 30 s:\n${out}`)), 30_000);
    const onData = (d: Buffer) => {
      out += d.toString();
      const m = /Running on http:\/\/127\.0\.0\.1:(\d+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        ok(Number(m[1]));
      }
    };
    proc.stdout!.on('data', onData);
    proc.stderr!.on('data', onData);
    proc.once('exit', (code) => {
      clearTimeout(timer);
      fail(new Error(`moto_server exited (${code}):\n${out}`));
    });
  }).catch((err) => {
    proc.kill('SIGKILL');
    throw err;
  });
  // Keep draining its request log so the pipe never fills.
  proc.stdout!.resume();
  proc.stderr!.resume();
  const endpoint = `http://127.0.0.1:${port}`;
  const bucket = opts.bucket ?? `halo-test-${randomBytes(4).toString('hex')}`;
  const credentials = { AWS_ACCESS_KEY_ID: 'halo-test', AWS_SECRET_ACCESS_KEY: 'halo-test-secret', AWS_REGION: 'us-east-1' };
  const client = new S3Client({
    endpoint,
    forcePathStyle: true,
    region: credentials.AWS_REGION,
    credentials: { accessKeyId: credentials.AWS_ACCESS_KEY_ID, secretAccessKey: credentials.AWS_SECRET_ACCESS_KEY },
    requestChecksumCalculation: 'WHEN_REQUIRED',
    responseChecksumValidation: 'WHEN_REQUIRED',
  });
  try {
    await client.send(new CreateBucketCommand({ Bucket: bucket }));
  } catch (err) {
    proc.kill('SIGKILL');
    throw err;
  }
  return {
    endpoint,
    bucket,
    client,
    env: (prefix = 'halo') => ({ HALO_STORE: `s3://${bucket}/${prefix}`, AWS_ENDPOINT_URL: endpoint, ...credentials }),
    stop: async () => {
      client.destroy();
      if (proc.exitCode !== null) return;
      const exited = new Promise((r) => proc.once('exit', r));
      proc.kill('SIGTERM');
      await Promise.race([exited, new Promise((r) => setTimeout(r, 5000))]);
      if (proc.exitCode === null) proc.kill('SIGKILL');
    },
  };
}
