/**
 * The docker compose override that spreads the stack over a box of several GPUs (`halo compose-replicas N`):
 * the learner on the first `learnerGpus` GPUs and one vLLM replica alone on each other GPU, sampled as one pool.
 * The split is `./launch.sh gpu`'s (bin/launch-gpu.sh gpu_split), so the same box runs the same way with or
 * without Docker; on one GPU vLLM and the learner share it, as docker-compose.yml alone runs them.
 */

import { ConfigError } from '../lib/config/config-error';

/** The parts of a compose service this file reads or writes; the rest of the base `vllm` service is copied as is. */
export interface ComposeService {
  command?: string[];
  ports?: unknown[];
  environment?: Record<string, unknown>;
  depends_on?: Record<string, { condition: string }>;
  deploy?: unknown;
  [key: string]: unknown;
}

export interface ReplicaPlan {
  /** GPUs of the box. */
  gpus: number;
  /** The learner's device ids. */
  learnerDevices: string[];
  /** Replica services in pool order, each with its device id and published host port. */
  replicas: { service: string; device: string; hostPort: number }[];
  /** vLLM's share of a replica's GPU. */
  gpuMemoryUtilization: string;
  /** policy.baseUrls (`--policy-url` of halo train / halo mcts), one per replica, by service host name. */
  policyUrls: string[];
}

/** The port vLLM listens on inside each replica container and the first one published on the host. */
export const VLLM_CONTAINER_PORT = 8000;
/** A replica's share of its GPU when nothing else runs there (HALO_VLLM_REPLICA_UTIL's default in bin/launch-gpu.sh). */
export const REPLICA_GPU_UTIL = '0.9';
/** Compose's tag that replaces a base file's value instead of merging into it (Compose 2.24.4 and later). */
export const OVERRIDE_TAG = '!override';

/** Replica i (from 0): the first keeps the base file's service name, as the first of ./launch.sh gpu keeps vllm.pid. */
export function replicaService(i: number): string {
  return i === 0 ? 'vllm' : `vllm-${i + 1}`;
}

export function planReplicas(gpus: number, learnerGpus = 1, baseUtil = '0.5'): ReplicaPlan {
  if (!Number.isInteger(gpus) || gpus < 1) throw new ConfigError(`compose-replicas: ${gpus} GPUs: a whole number of GPUs, 1 or more`);
  if (!Number.isInteger(learnerGpus) || learnerGpus < 1) throw new ConfigError(`compose-replicas: --learner-gpus ${learnerGpus}: a whole number of GPUs, 1 or more`);
  if (gpus === 1 && learnerGpus !== 1) throw new ConfigError(`compose-replicas: --learner-gpus ${learnerGpus} on 1 GPU: vLLM and the learner share the one GPU`);
  if (gpus > 1 && learnerGpus >= gpus) throw new ConfigError(`compose-replicas: --learner-gpus ${learnerGpus} leaves none of the ${gpus} GPUs for vLLM: at most ${gpus - 1}`);
  const devices = Array.from({ length: gpus }, (_, g) => String(g));
  const learnerDevices = gpus === 1 ? ['0'] : devices.slice(0, learnerGpus);
  const replicaDevices = gpus === 1 ? ['0'] : devices.slice(learnerGpus);
  const replicas = replicaDevices.map((device, i) => ({ service: replicaService(i), device, hostPort: VLLM_CONTAINER_PORT + i }));
  return {
    gpus,
    learnerDevices,
    replicas,
    gpuMemoryUtilization: gpus === 1 ? baseUtil : REPLICA_GPU_UTIL,
    policyUrls: replicas.map((r) => `http://${r.service}:${VLLM_CONTAINER_PORT}/v1`),
  };
}

/** The base command with `flag`'s value replaced; a base file without the flag is an error, never a silent no-op. */
function withFlag(command: string[], flag: string, value: string): string[] {
  const at = command.indexOf(flag);
  if (at < 0 || at + 1 >= command.length) throw new Error(`compose-replicas: the base vllm service's command has no ${flag} value to set`);
  return [...command.slice(0, at + 1), value, ...command.slice(at + 2)];
}

function gpuReservation(deviceIds: string[]): { resources: { reservations: { devices: unknown[] } } } {
  return { resources: { reservations: { devices: [{ driver: 'nvidia', device_ids: deviceIds, capabilities: ['gpu'] }] } } };
}

export interface ReplicaOverride {
  plan: ReplicaPlan;
  /** `services` of the override file; the values under `overridden` paths carry OVERRIDE_TAG when written. */
  services: Record<string, ComposeService>;
  /** [service, key] pairs whose value replaces the base file's (Compose merges sequences such as devices otherwise). */
  overridden: [string, string][];
}

/**
 * The override for `plan`, from the base file's `vllm` service (`base`): that service pinned to the first replica's
 * GPU, every other replica a copy of it on its own GPU and host port (started once the first is healthy, so the
 * model is downloaded into the shared cache once), the learner on its GPUs, and the control worker allowed to
 * send the policy key over plain http to every replica's host name.
 */
export function replicaOverride(base: ComposeService, plan: ReplicaPlan, baseControlEnv: Record<string, unknown> = {}): ReplicaOverride {
  if (!Array.isArray(base.command)) throw new Error('compose-replicas: the base vllm service has no command list');
  const command = withFlag(base.command.map(String), '--gpu-memory-utilization', plan.gpuMemoryUtilization);
  const services: Record<string, ComposeService> = {};
  const overridden: [string, string][] = [];
  for (const [i, r] of plan.replicas.entries()) {
    if (i === 0) {
      services[r.service] = { command, deploy: gpuReservation([r.device]) };
      overridden.push([r.service, 'deploy']);
      continue;
    }
    const { ports: _ports, depends_on: _deps, deploy: _deploy, ...rest } = base;
    services[r.service] = {
      ...structuredClone(rest),
      command,
      ports: [`127.0.0.1:${r.hostPort}:${VLLM_CONTAINER_PORT}`],
      depends_on: { [replicaService(0)]: { condition: 'service_healthy' } },
      deploy: gpuReservation([r.device]),
    };
  }
  services.learner = { environment: { HALO_LEARNER_GPUS: String(plan.learnerDevices.length) }, deploy: gpuReservation(plan.learnerDevices) };
  overridden.push(['learner', 'deploy']);
  const hosts = String(baseControlEnv.HALO_CREDENTIAL_HTTP_HOSTS ?? '')
    .split(',')
    .map((h) => h.trim())
    .filter((h) => h && !plan.replicas.some((r) => r.service === h));
  services['control-worker'] = { environment: { HALO_CREDENTIAL_HTTP_HOSTS: [...plan.replicas.map((r) => r.service), ...hosts].join(',') } };
  return { plan, services, overridden };
}
