import type { Client } from '@temporalio/client';
import { ensureAdapterLoaded } from '../activities/adapters';
import type { ServedAdapter } from '../lib/serving/iteration-policy';
import { clipErrorText, resolveCredential } from '../lib/serving/credentials';
import { statusQuery } from '../workflows/messages';

/**
 * After a restart (a preempted box, `restart: unless-stopped`), vLLM has forgotten every runtime-loaded
 * adapter. Open training runs report the adapter they sample from (`servedAdapter` in their status); load
 * each into its server again before the runs ask for it. Best effort: sampling reloads on its own when a
 * server answers 404 for the run's adapter, so a server that is not up yet only costs that later reload.
 */
export async function reloadServedAdapters(client: Client, say: (msg: string) => void): Promise<{ loaded: string[]; present: string[]; failed: string[] }> {
  const out = { loaded: [] as string[], present: [] as string[], failed: [] as string[] };
  for await (const r of client.workflow.list({ query: `HaloKind = 'train' AND ExecutionStatus = 'Running'` })) {
    const status = (await client.workflow
      .getHandle(r.workflowId)
      .query(statusQuery)
      .catch(() => undefined)) as { servedAdapter?: ServedAdapter } | undefined;
    const a = status?.servedAdapter;
    if (!a || typeof a.base_url !== 'string' || typeof a.lora_name !== 'string' || typeof a.lora_path !== 'string') continue;
    // The URL comes from a workflow's status, which whoever can start a workflow writes: the policy key goes
    // there only when its origin is one this process allows for that credential; nothing is sent otherwise.
    const cred = resolveCredential({ url: a.base_url, field: `run ${r.workflowId} servedAdapter`, fallback: 'policy' }, process.env);
    if (!cred.ok) {
      out.failed.push(a.lora_name);
      say(`not loading adapter ${a.lora_name} of run ${r.workflowId}: ${cred.message}`);
      continue;
    }
    try {
      // Only the three fields: nothing else of the status (a credential name, a variable) reaches the request.
      const { loaded } = await ensureAdapterLoaded({ base_url: a.base_url, lora_name: a.lora_name, lora_path: a.lora_path, timeout_ms: 30_000 });
      (loaded ? out.loaded : out.present).push(a.lora_name);
      if (loaded) say(`loaded adapter ${a.lora_name} of run ${r.workflowId} into ${a.base_url} again`);
    } catch (err) {
      out.failed.push(a.lora_name);
      say(`could not load adapter ${a.lora_name} into ${a.base_url} (${clipErrorText((err as Error).message)}); sampling will load it when it is needed`);
    }
  }
  return out;
}
