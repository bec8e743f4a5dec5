import { ApplicationFailure } from '@temporalio/activity';
import { resolveCredential, type CredentialName } from '../lib/serving/credentials';

/**
 * The API key for a request to `url`, read from this worker's environment under the credential's name; a
 * credential the worker does not know, a legacy `apiKeyEnv` naming any other variable, or a configured
 * credential (its variable set, even empty) for an origin it is not allowed to reach (lib/serving/credentials.ts
 * originAllowed) is a non-retryable failure, raised before any request: the server receives nothing.
 */
export function apiKeyFor(o: { credential?: unknown; apiKeyEnv?: unknown; url: string; field: string; fallback: CredentialName }): string | undefined {
  const r = resolveCredential(o, process.env);
  if (!r.ok) throw ApplicationFailure.nonRetryable(r.message, r.kind);
  return r.key;
}
