import type { PolicyConfig } from '../config/config';

/**
 * A pool of OpenAI-compatible policy servers (vLLM replicas, `policy.baseUrls`): which replica takes the next
 * request, and what each one has done. Pure (the caller passes the clock): the control worker keeps one pool
 * per replica list (activities/policy-pool.ts) and every sampling request goes through it, a single server too.
 *
 * - Least loaded: the healthy replica with the fewest requests in flight; ties go to the one that took the fewest
 *   requests so far, then to the list's order, so an idle pool spreads its first requests over every replica.
 * - Draining: a replica whose request failed retryably (unreachable, timed out, 5xx, an adapter it lost again)
 *   takes no new request until its retry time, 2 s after the first failure in a row and doubling to 60 s with each
 *   failed retry (requests already in flight that fail while it is drained do not extend it); the request goes on
 *   to another replica. Past its retry time it is asked again (one request finds out whether it
 *   is back), and one answer makes it healthy. When every replica is drained, the one due first is asked anyway:
 *   a call is never failed without asking a replica.
 */

export const DRAIN_FIRST_MS = 2_000;
export const DRAIN_MAX_MS = 60_000;

/** The servers a policy samples from: `baseUrls` when it names several, else its one `baseUrl`. */
export function policyReplicas(policy: Pick<PolicyConfig, 'baseUrl' | 'baseUrls'>): string[] {
  return policy.baseUrls && policy.baseUrls.length > 0 ? [...policy.baseUrls] : [policy.baseUrl];
}

/** A server's address without trailing slashes and `/v1`: two spellings of one replica are one replica. */
export function replicaKey(url: string): string {
  return url.replace(/\/+$/, '').replace(/\/v1$/, '');
}

/** What one replica did, as the run's metrics row carries it (snake_case, like the rest of the row). */
export interface ReplicaStats {
  url: string;
  /** Requests sent to it (answered or failed). */
  requests: number;
  /** Of those, failed retryably (each drained it). */
  failures: number;
  /** Mean milliseconds of its answered requests; absent before the first answer. */
  mean_latency_ms?: number;
  /** Adapter load requests it was sent (a new version, or one it forgot when it restarted). */
  adapter_loads: number;
  /** Whether it takes requests now (false: drained until its retry time). */
  healthy: boolean;
}

interface Replica {
  url: string;
  inFlight: number;
  requests: number;
  failures: number;
  answered: number;
  latencyMs: number;
  adapterLoads: number;
  /** Failures since its last answer. */
  failuresInRow: number;
  /** Drained until this time (ms); 0 when healthy. */
  drainedUntil: number;
}

export class ReplicaPool {
  private readonly replicas: Replica[];

  constructor(urls: readonly string[]) {
    if (urls.length === 0) throw new Error('a policy pool needs at least one server');
    const keys = urls.map(replicaKey);
    const twice = keys.find((k, i) => keys.indexOf(k) !== i);
    if (twice) throw new Error(`policy pool: ${twice} is listed twice`);
    this.replicas = urls.map((url) => ({ url, inFlight: 0, requests: 0, failures: 0, answered: 0, latencyMs: 0, adapterLoads: 0, failuresInRow: 0, drainedUntil: 0 }));
  }

  get urls(): string[] {
    return this.replicas.map((r) => r.url);
  }

  /**
   * The replica for the next request, leaving out those in `tried` (this call already failed there); undefined
   * when every replica was tried. Taking it counts the request as in flight until `answered` or `failed`.
   */
  take(now: number, tried: ReadonlySet<string> = new Set()): string | undefined {
    const open = this.replicas.filter((r) => !tried.has(r.url));
    if (open.length === 0) return undefined;
    // Past its retry time a drained replica takes one request, the probe; more only once that one is answered.
    const healthy = open.filter((r) => r.drainedUntil <= now && !(r.failuresInRow > 0 && r.inFlight > 0));
    const pick =
      healthy.length > 0
        ? healthy.reduce((best, r) => (r.inFlight < best.inFlight || (r.inFlight === best.inFlight && r.requests < best.requests) ? r : best))
        : open.reduce((best, r) => (r.drainedUntil < best.drainedUntil ? r : best));
    pick.inFlight++;
    pick.requests++;
    return pick.url;
  }

  /** The request taken on `url` was answered after `ms`: the replica is healthy. */
  answered(url: string, ms: number): void {
    const r = this.get(url);
    r.inFlight = Math.max(0, r.inFlight - 1);
    r.answered++;
    r.latencyMs += ms;
    r.failuresInRow = 0;
    r.drainedUntil = 0;
  }

  /** The request taken on `url` failed retryably: the replica is drained (backoff doubling per failure in a row). */
  failed(url: string, now: number): void {
    const r = this.get(url);
    r.inFlight = Math.max(0, r.inFlight - 1);
    this.drain(r, now);
  }

  /** The request taken on `url` ended with the request's own failure (a 4xx): the replica is not to blame. */
  released(url: string): void {
    const r = this.get(url);
    r.inFlight = Math.max(0, r.inFlight - 1);
  }

  /** Adapter load requests sent to `url`. */
  loads(url: string, count: number): void {
    this.get(url).adapterLoads += count;
  }

  /** A replica that could not take an adapter load (unreachable) is drained like one that failed a request. */
  unreachable(url: string, now: number): void {
    this.drain(this.get(url), now);
  }

  stats(now: number): ReplicaStats[] {
    return this.replicas.map((r) => ({
      url: r.url,
      requests: r.requests,
      failures: r.failures,
      ...(r.answered > 0 ? { mean_latency_ms: Math.round(r.latencyMs / r.answered) } : {}),
      adapter_loads: r.adapterLoads,
      healthy: r.drainedUntil <= now,
    }));
  }

  private drain(r: Replica, now: number): void {
    r.failures++;
    // Requests that were in flight when the replica went away fail together: one outage, one step of the backoff.
    if (r.drainedUntil > now) return;
    r.failuresInRow++;
    r.drainedUntil = now + Math.min(DRAIN_MAX_MS, DRAIN_FIRST_MS * 2 ** (r.failuresInRow - 1));
  }

  private get(url: string): Replica {
    const r = this.replicas.find((x) => x.url === url);
    if (!r) throw new Error(`policy pool: ${url} is not one of its replicas (${this.urls.join(', ')})`);
    return r;
  }
}
