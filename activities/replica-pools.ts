import { ApplicationFailure } from '@temporalio/activity';
import type { PolicyConfig } from '../lib/config/config';
import { policyReplicas, ReplicaPool, replicaKey, type ReplicaStats } from '../lib/serving/policy-pool';

/**
 * The control worker's policy pools (lib/serving/policy-pool.ts), one per replica list, shared by every activity of this
 * process (sampling and adapter loads), so "least loaded" counts every request in flight here and a replica that
 * failed a load is drained for sampling too.
 */
const pools = new Map<string, ReplicaPool>();

/** This process's pool for a policy's servers (created on first use); a list naming a replica twice is refused. */
export function poolOf(policy: Pick<PolicyConfig, 'baseUrl' | 'baseUrls'>): ReplicaPool {
  const urls = policyReplicas(policy);
  const key = urls.map(replicaKey).join(' ');
  let pool = pools.get(key);
  if (!pool) {
    try {
      pool = new ReplicaPool(urls);
    } catch (err) {
      throw ApplicationFailure.create({ message: (err as Error).message, type: 'InvalidInput', nonRetryable: true });
    }
    pools.set(key, pool);
  }
  return pool;
}

/** What each of a policy's servers did in this process, as the run's metrics row carries it. */
export function replicaStats(policy: Pick<PolicyConfig, 'baseUrl' | 'baseUrls'>): ReplicaStats[] {
  return poolOf(policy).stats(Date.now());
}
