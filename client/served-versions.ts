import { ApplicationFailure } from '@temporalio/common';
import { listLoadedAdapters, serverRoot } from '../activities/adapters';
import type { HaloConfig } from '../lib/config/config';

/**
 * Versions of a run that a vLLM of the config serves now (`GET /v1/models`: one card per loaded adapter, named
 * `<run>-v<N>`). Retention keeps them: a run that has ended leaves its last adapter loaded, and deleting the
 * folder would break the next reload of that name (a restarted vLLM, a second replica) and any evaluation of it.
 */
export interface ServedVersions {
  versions: number[];
  /** One line per kept version, for the operator. */
  reasons: string[];
  /** Servers that refused the connection (not running): they serve nothing now. */
  unreachable: string[];
}

/** The vLLM servers a config talks to: the policy server and those runs load adapters into. */
export function configuredVllmUrls(cfg: HaloConfig): string[] {
  const urls = [cfg.policy.baseUrl, cfg.train.vllmBaseUrl, cfg.mcts.vllmBaseUrl].filter((u): u is string => typeof u === 'string');
  const seen = new Set<string>();
  return urls.filter((u) => !seen.has(serverRoot(u)) && seen.add(serverRoot(u)));
}

/**
 * Asks each server what it serves. A server that is not running (connection refused) serves nothing and is only
 * reported; one that answers with an error (a key refused, a proxy's page) or not at all leaves what it serves
 * unknown: an Error, and retention then changes nothing.
 */
export async function servedVersions(urls: string[], run: string, list = listLoadedAdapters): Promise<ServedVersions> {
  const out: ServedVersions = { versions: [], reasons: [], unreachable: [] };
  const name = new RegExp(`^${run.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}-v([1-9][0-9]*)$`);
  for (const url of urls) {
    let models: { id: string }[];
    try {
      models = await list({ base_url: url, timeout_ms: 10_000 });
    } catch (err) {
      // Only a refused connection means nothing listens there; a reset or a timeout is a server in trouble.
      if (err instanceof ApplicationFailure && err.type === 'VllmUnreachable' && /ECONNREFUSED/.test(err.message)) {
        out.unreachable.push(serverRoot(url));
        continue;
      }
      throw new Error(`halo gc --run ${run}: could not ask vLLM at ${serverRoot(url)} which adapters it serves, so nothing was changed: ${(err as Error).message}`, {
        cause: err,
      });
    }
    for (const m of models) {
      const v = name.exec(m.id);
      if (!v) continue;
      out.versions.push(Number(v[1]));
      out.reasons.push(`v${v[1]}: vLLM at ${serverRoot(url)} serves it as ${m.id}`);
    }
  }
  out.versions = [...new Set(out.versions)].sort((a, b) => a - b);
  return out;
}
