import type { S3Client, S3ClientConfig } from '@aws-sdk/client-s3';
import type { S3Location } from './location';

/** The SDK is loaded when an object store is used: a process on the local folder never pays its start-up. */
const sdk = (): typeof import('@aws-sdk/client-s3') => require('@aws-sdk/client-s3');

/**
 * An S3-compatible object store (AWS S3, MinIO, Cloudflare R2, GCS's S3 API), configured by the standard
 * variables: AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL (absent: AWS itself), AWS_ACCESS_KEY_ID,
 * AWS_SECRET_ACCESS_KEY (or any other source of the SDK's default credential chain), AWS_REGION (default
 * us-east-1). A custom endpoint is addressed path-style (bucket in the path), which every S3-compatible
 * server accepts.
 */
export function s3ClientFromEnv(env: NodeJS.ProcessEnv = process.env): S3Client {
  const endpoint = env.AWS_ENDPOINT_URL_S3 || env.AWS_ENDPOINT_URL || undefined;
  const cfg: S3ClientConfig = {
    region: env.AWS_REGION || env.AWS_DEFAULT_REGION || 'us-east-1',
    ...(endpoint ? { endpoint, forcePathStyle: true } : {}),
    // Keys given in `env` are used as such; without them the SDK's default chain (process environment,
    // profiles, instance roles) applies.
    ...(env.AWS_ACCESS_KEY_ID && env.AWS_SECRET_ACCESS_KEY
      ? {
          credentials: {
            accessKeyId: env.AWS_ACCESS_KEY_ID,
            secretAccessKey: env.AWS_SECRET_ACCESS_KEY,
            ...(env.AWS_SESSION_TOKEN ? { sessionToken: env.AWS_SESSION_TOKEN } : {}),
          },
        }
      : {}),
    // Checksums only where the API requires them: several S3-compatible servers reject the SDK's default
    // trailing checksums.
    requestChecksumCalculation: 'WHEN_REQUIRED',
    responseChecksumValidation: 'WHEN_REQUIRED',
    maxAttempts: 5,
  };
  return new (sdk().S3Client)(cfg);
}

export class ObjectNotFoundError extends Error {
  constructor(
    readonly key: string,
    where: string,
  ) {
    super(`object ${key} not found in ${where}`);
    this.name = 'ObjectNotFoundError';
  }
}

interface AwsError {
  name?: string;
  Code?: string;
  $metadata?: { httpStatusCode?: number };
}

const statusOf = (err: unknown) => (err as AwsError)?.$metadata?.httpStatusCode;
const isNotFound = (err: unknown) => statusOf(err) === 404 || ['NotFound', 'NoSuchKey'].includes((err as AwsError)?.name ?? '');

/** The few operations the blob store and adapter checkpoints need, on one bucket. */
export class S3Objects {
  /** Servers that refuse `If-None-Match: *` (501/400 NotImplemented) get head-then-put from then on. */
  private conditional = true;

  constructor(
    readonly loc: S3Location,
    readonly client: S3Client = s3ClientFromEnv(),
  ) {}

  where(): string {
    return `s3://${this.loc.bucket}${this.loc.prefix ? '/' + this.loc.prefix : ''}`;
  }

  async exists(key: string): Promise<boolean> {
    try {
      await this.client.send(new (sdk().HeadObjectCommand)({ Bucket: this.loc.bucket, Key: key }));
      return true;
    } catch (err) {
      if (isNotFound(err)) return false;
      throw err;
    }
  }

  async get(key: string): Promise<Buffer> {
    try {
      const res = await this.client.send(new (sdk().GetObjectCommand)({ Bucket: this.loc.bucket, Key: key }));
      return Buffer.from(await res.Body!.transformToByteArray());
    } catch (err) {
      if (isNotFound(err)) throw new ObjectNotFoundError(key, this.where());
      throw err;
    }
  }

  /**
   * Writes `key` unless it exists. Returns true when this call created it, false when it was there already
   * (or a concurrent writer created it first). With `If-None-Match: *` the server decides; on a server
   * without conditional writes it is head-then-put, which is race-safe only for content-addressed keys
   * (every writer writes the same bytes), the only ones written that way without a later conditional commit.
   */
  async putIfAbsent(key: string, body: Buffer, contentType?: string): Promise<boolean> {
    const put = (conditional: boolean) =>
      this.client.send(
        new (sdk().PutObjectCommand)({
          Bucket: this.loc.bucket,
          Key: key,
          Body: body,
          ...(contentType ? { ContentType: contentType } : {}),
          ...(conditional ? { IfNoneMatch: '*' } : {}),
        }),
      );
    if (this.conditional) {
      for (let attempt = 0; ; attempt++) {
        try {
          await put(true);
          return true;
        } catch (err) {
          const status = statusOf(err);
          if (status === 412) return false; // PreconditionFailed: it exists
          // 409 ConditionalRequestConflict: a concurrent conditional write of the same key is in flight.
          if (status === 409 && attempt < 5) {
            if (await this.exists(key)) return false;
            await new Promise((r) => setTimeout(r, 50 * (attempt + 1)));
            continue;
          }
          if (status === 501 || (status === 400 && /NotImplemented/i.test((err as AwsError).name ?? ''))) {
            this.conditional = false;
            break;
          }
          throw err;
        }
      }
    }
    if (await this.exists(key)) return false;
    await put(false);
    return true;
  }

  /**
   * Makes an existing object young again: a copy onto itself with `MetadataDirective: REPLACE` (the only
   * self-copy S3 allows) sets a new LastModified server-side, without sending the bytes.
   */
  async touch(key: string, contentType?: string): Promise<void> {
    await this.client.send(
      new (sdk().CopyObjectCommand)({
        Bucket: this.loc.bucket,
        Key: key,
        CopySource: `${this.loc.bucket}/${key.split('/').map(encodeURIComponent).join('/')}`,
        MetadataDirective: 'REPLACE',
        ...(contentType ? { ContentType: contentType } : {}),
      }),
    );
  }

  /** Every object under `prefix` with its size and LastModified (ListObjectsV2, page by page). */
  async listWithAge(prefix: string): Promise<{ key: string; size: number; mtimeMs: number }[]> {
    const out: { key: string; size: number; mtimeMs: number }[] = [];
    let token: string | undefined;
    do {
      const res = await this.client.send(new (sdk().ListObjectsV2Command)({ Bucket: this.loc.bucket, Prefix: prefix, ContinuationToken: token }));
      for (const o of res.Contents ?? []) if (o.Key) out.push({ key: o.Key, size: o.Size ?? 0, mtimeMs: o.LastModified?.getTime() ?? 0 });
      token = res.IsTruncated ? res.NextContinuationToken : undefined;
    } while (token);
    return out;
  }

  /** Deletes keys, 1,000 a request (DeleteObjects' limit); a key already gone is no error. */
  async deleteMany(keys: string[]): Promise<void> {
    for (let i = 0; i < keys.length; i += 1000) {
      const batch = keys.slice(i, i + 1000);
      const res = await this.client.send(new (sdk().DeleteObjectsCommand)({ Bucket: this.loc.bucket, Delete: { Objects: batch.map((Key) => ({ Key })), Quiet: true } }));
      const errors = (res.Errors ?? []).filter((e) => e.Code !== 'NoSuchKey');
      if (errors.length > 0) {
        throw new Error(
          `deleting ${errors.length} of ${batch.length} objects in ${this.where()} failed: ${errors
            .slice(0, 3)
            .map((e) => `${e.Key}: ${e.Code} ${e.Message ?? ''}`.trim())
            .join('; ')}`,
        );
      }
    }
  }

  async list(prefix: string): Promise<string[]> {
    return (await this.listWithAge(prefix)).map((o) => o.key);
  }
}
