import { ApplicationFailure } from '@temporalio/activity';
import type { PolicyConfig } from '../lib/config/config';
import type { ServedAdapter } from '../lib/serving/iteration-policy';
import { clipErrorText } from '../lib/serving/credentials';
import { withServedAdapter, type AdapterCallStats } from './adapters';
import { missingModelOf } from './policy-client';
import { poolOf } from './replica-pools';

/**
 * Sampling on a policy's servers (lib/serving/policy-pool.ts; this process's pools: replica-pools.ts). A request goes to the replica the pool picks; the adapter its model names is loaded on that very replica first
 * (`withServedAdapter`: one idempotent load per replica and version, again on a 404 after a restart). A replica
 * that fails retryably is drained and the request goes on to the next one, each replica at most once per call:
 * that is the pool routing around a dead server, not a retry of the same request on it (Temporal owns those; when
 * every replica failed, the call fails retryably and Temporal asks again). A failure that is the request's own (a
 * 4xx: a bad request, a missing model that is not the adapter) ends the call on the first replica.
 *
 * Nothing a replica answers is off-policy: the request names the adapter version it samples with, a replica that
 * lacks it answers 404 and gets it loaded, and the tokens, log-probs and grammar are those of the one request that
 * answered.
 */

export interface PooledAnswer<T> {
  value: T;
  /** The replica that answered. */
  replica: string;
  /** Adapter loads of this call on that replica; absent without an adapter. */
  adapter?: AdapterCallStats;
}

/**
 * `ask(policyOnReplica)` on the least-loaded healthy replica of `policy`, with `adapter` served there. A single
 * server keeps the adapter endpoint it was given (train.vllmBaseUrl may name it by another address); in a pool of
 * several, each replica loads at its own address.
 */
export async function onPolicyPool<T>(policy: PolicyConfig, adapter: ServedAdapter | undefined, ask: (onReplica: PolicyConfig) => Promise<T>): Promise<PooledAnswer<T>> {
  const pool = poolOf(policy);
  const several = pool.urls.length > 1;
  const tried = new Set<string>();
  const failures: string[] = [];
  let last: unknown;
  for (let url = pool.take(Date.now(), tried); url !== undefined; url = pool.take(Date.now(), tried)) {
    tried.add(url);
    const onReplica: PolicyConfig = { ...policy, baseUrl: url };
    const t0 = Date.now();
    try {
      let answer: PooledAnswer<T>;
      if (adapter) {
        const served = await withServedAdapter(several ? { ...adapter, base_url: url } : adapter, () => ask(onReplica), missingModelOf);
        pool.loads(url, served.stats.loadRequests);
        answer = { value: served.value, replica: url, adapter: served.stats };
      } else {
        answer = { value: await ask(onReplica), replica: url };
      }
      pool.answered(url, Date.now() - t0);
      return answer;
    } catch (err) {
      if (!(err instanceof ApplicationFailure) || err.nonRetryable) {
        pool.released(url);
        throw err;
      }
      pool.failed(url, Date.now());
      last = err;
      failures.push(`${url}: ${clipErrorText(err.message, 300)}`);
    }
  }
  if (!several || failures.length <= 1) throw last;
  throw ApplicationFailure.create({
    message: `every policy replica failed this request (each is drained and asked again later): ${failures.join('; ')}`,
    type: 'PolicyReplicasUnavailable',
    nonRetryable: false,
  });
}
