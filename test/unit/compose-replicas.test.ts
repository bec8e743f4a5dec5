import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type CollectionTag, isMap, parse as parseYaml, parseDocument, type YAMLMap } from 'yaml';
import { REPO_ROOT } from '../../client/processes';
import { replicaOverrideYaml } from '../../client/commands/compose-replicas';
import { planReplicas } from '../../client/compose-replicas';
import { parseConfig } from '../../lib/config/config';
import { loadConfigFile } from '../../host/config-file';
import { originAllowed } from '../../lib/serving/credentials';

// docker-compose.replicas.yml (`halo compose-replicas N`) on top of docker-compose.yml, merged as Compose merges an
// override file, for boxes of 1, 2 and 8 GPUs: every replica on a GPU of its own, the learner on the others, and the
// policy URL list the run gets naming exactly the replica services the control worker may send the key to.

type Obj = Record<string, unknown>;
interface Device {
  driver?: string;
  count?: string | number;
  device_ids?: string[];
  capabilities?: string[];
}

// Compose's `!override` replaces the base file's value; here it reads as a marker the merge below honours.
const OVERRIDDEN = Symbol('override');
const overrideTags = [{ tag: '!override', collection: 'map', resolve: (m: YAMLMap) => Object.assign(m.toJSON(), { [OVERRIDDEN]: true }) } as unknown as CollectionTag];

const baseText = readFileSync(join(REPO_ROOT, 'docker-compose.yml'), 'utf8');
const base = parseYaml(baseText) as { services: Record<string, Obj> };

/** Compose's merge for the keys the override sets: mappings merge, sequences of command replace, ports append. */
function merge(b: unknown, o: unknown, key = ''): unknown {
  if (o && typeof o === 'object' && (o as { [OVERRIDDEN]?: boolean })[OVERRIDDEN]) return o;
  if (Array.isArray(o)) return key === 'ports' && Array.isArray(b) ? [...b, ...o] : o;
  if (o && typeof o === 'object' && b && typeof b === 'object' && !Array.isArray(b)) {
    const out: Obj = { ...(b as Obj) };
    for (const [k, v] of Object.entries(o as Obj)) out[k] = merge((b as Obj)[k], v, k);
    return out;
  }
  return o;
}

function stack(gpus: number, learnerGpus = 1): { services: Record<string, Obj>; override: Record<string, Obj>; urls: string[]; text: string } {
  const { text, policyUrls } = replicaOverrideYaml(baseText, gpus, learnerGpus);
  const override = (parseYaml(text, { customTags: overrideTags }) as { services: Record<string, Obj> }).services;
  const services: Record<string, Obj> = { ...base.services };
  for (const [name, s] of Object.entries(override)) services[name] = merge(base.services[name], s) as Obj;
  return { services, override, urls: policyUrls, text };
}

const devicesOf = (s: Obj): Device[] => ((s.deploy as Obj)?.resources as { reservations?: { devices?: Device[] } })?.reservations?.devices ?? [];
const flag = (s: Obj, f: string): string | undefined => {
  const c = (s.command as string[]).map(String);
  return c.includes(f) ? c[c.indexOf(f) + 1] : undefined;
};
const vllmServices = (services: Record<string, Obj>): string[] => Object.keys(services).filter((n) => /^vllm(-\d+)?$/.test(n));

for (const [gpus, learnerGpus] of [
  [1, 1],
  [2, 1],
  [8, 1],
  [8, 2],
]) {
  test(`${gpus} GPU${gpus === 1 ? '' : 's'}, learner on ${learnerGpus}: one replica per other GPU, each on its own device and port, the policy URLs naming them`, () => {
    const { services, override, urls } = stack(gpus, learnerGpus);
    const replicas = vllmServices(services);
    const expected = gpus === 1 ? 1 : gpus - learnerGpus;
    assert.equal(replicas.length, expected);
    assert.deepEqual(replicas, ['vllm', ...Array.from({ length: expected - 1 }, (_, i) => `vllm-${i + 2}`)]);

    // Devices: every replica one GPU of its own, the learner the first ones; on one GPU both share GPU 0.
    const learnerDevices = devicesOf(services.learner);
    assert.equal(learnerDevices.length, 1, 'the learner reserves one device entry');
    assert.equal(learnerDevices[0].count, undefined, 'device_ids, not count: all');
    assert.deepEqual(
      learnerDevices[0].device_ids,
      Array.from({ length: learnerGpus }, (_, g) => String(g)),
    );
    assert.equal((services.learner.environment as Obj).HALO_LEARNER_GPUS, String(learnerGpus));
    const replicaDevices = replicas.map((r) => {
      const d = devicesOf(services[r]);
      assert.equal(d.length, 1, `${r} reserves one device entry`);
      assert.equal(d[0].count, undefined, `${r}: device_ids, not count: all`);
      assert.deepEqual(d[0].capabilities, ['gpu']);
      assert.equal(d[0].driver, 'nvidia');
      assert.equal(d[0].device_ids?.length, 1, `${r} is pinned to one GPU`);
      return d[0].device_ids![0];
    });
    assert.equal(new Set(replicaDevices).size, replicaDevices.length, 'no two replicas on one GPU');
    if (gpus === 1) assert.deepEqual(replicaDevices, ['0']);
    else {
      for (const d of replicaDevices) assert.ok(!learnerDevices[0].device_ids!.includes(d), `GPU ${d} is the learner's`);
      assert.deepEqual(
        [...learnerDevices[0].device_ids!, ...replicaDevices].map(Number).sort((a, b) => a - b),
        Array.from({ length: gpus }, (_, g) => g),
      );
    }
    // The merged deploy replaces the base's (count: all would reserve every GPU again): Compose needs the tag.
    for (const name of ['vllm', 'learner']) assert.ok((override[name].deploy as { [OVERRIDDEN]?: boolean })[OVERRIDDEN], `${name}.deploy carries !override`);

    // Ports: the first keeps host port 8000; each replica publishes its own on 127.0.0.1, vLLM on 8000 inside.
    const published = replicas.map((r) => {
      const ports = (services[r].ports as string[]).map(String);
      assert.equal(ports.length, 1, `${r} publishes one port`);
      const m = /^127\.0\.0\.1:(\d+):(\d+)$/.exec(ports[0]);
      assert.ok(m, `${r}: ${ports[0]} is bound to 127.0.0.1`);
      assert.equal(m![2], flag(services[r], '--port'));
      return Number(m![1]);
    });
    assert.deepEqual(
      published,
      replicas.map((_, i) => 8000 + i),
      'the ports ./launch.sh gpu gives the same replicas',
    );

    // Every replica is the base vllm service but for its GPU share: same image, flags, key, adapters and networks.
    const baseVllm = base.services.vllm;
    for (const r of replicas) {
      const s = services[r];
      assert.equal(flag(s, '--gpu-memory-utilization'), gpus === 1 ? flag(baseVllm, '--gpu-memory-utilization') : '0.9');
      const strip = (c: unknown) => (c as string[]).map(String).filter((_, i, all) => all[i] !== '--gpu-memory-utilization' && all[i - 1] !== '--gpu-memory-utilization');
      assert.deepEqual(strip(s.command), strip(baseVllm.command), `${r}'s other flags are the base's`);
      for (const key of ['image', 'entrypoint', 'environment', 'volumes', 'networks', 'ipc', 'healthcheck', 'restart', 'stop_grace_period'])
        assert.deepEqual(s[key], baseVllm[key], `${r}.${key}`);
      if (r !== 'vllm') assert.deepEqual(s.depends_on, { vllm: { condition: 'service_healthy' } }, `${r} waits for the first (one model download)`);
    }

    // The pool: one URL per replica by its service host name, in that order, at vLLM's port, and a config the run accepts.
    assert.deepEqual(
      urls.map((u) => new URL(u).hostname),
      replicas,
    );
    for (const [i, u] of urls.entries()) assert.equal(new URL(u).port, flag(services[replicas[i]], '--port'));
    const cfgFile = loadConfigFile(join(REPO_ROOT, 'docker/compose-config.yaml')) as Obj;
    const cfg = parseConfig({ ...cfgFile, policy: { ...(cfgFile.policy as Obj), baseUrl: urls[0], baseUrls: urls } }, 'compose replicas');
    assert.deepEqual(cfg.policy.baseUrls, urls);
    // The control worker sends the policy key over plain http to every replica, and to no other host.
    const controlEnv = services['control-worker'].environment as Record<string, string>;
    assert.deepEqual(controlEnv.HALO_CREDENTIAL_HTTP_HOSTS.split(',').sort(), [...replicas].sort());
    for (const u of urls) assert.ok(originAllowed('policy', u, controlEnv), `the key may go to ${u}`);
    assert.ok(!originAllowed('policy', `http://vllm-${expected + 1}:8000/v1`, controlEnv));
    // The control worker reaches every replica (the models network) and the browser worker none.
    for (const r of replicas) {
      assert.ok((services[r].networks as string[]).some((n) => (services['control-worker'].networks as string[]).includes(n)));
      assert.ok(!(services[r].networks as string[]).some((n) => (services['browser-worker'].networks as string[]).includes(n)));
    }
    // What the override does not name stays the base file's.
    for (const name of Object.keys(base.services).filter((n) => !(n in override))) assert.deepEqual(services[name], base.services[name]);
  });
}

test('one GPU: the override changes nothing but naming GPU 0, and docker-compose.yml alone stays the one-GPU stack', () => {
  const { services } = stack(1);
  for (const name of Object.keys(base.services)) {
    const strip = (s: Obj) => {
      const { deploy: _d, environment, ...rest } = s;
      const { HALO_LEARNER_GPUS: _g, ...env } = (environment ?? {}) as Obj;
      return { ...rest, environment: env };
    };
    assert.deepEqual(strip(services[name]), strip(base.services[name]), name);
  }
  assert.deepEqual(devicesOf(base.services.vllm), [{ driver: 'nvidia', count: 'all', capabilities: ['gpu'] }]);
  assert.equal(vllmServices(base.services).length, 1);
});

test('bad splits are refused, naming the numbers', () => {
  assert.throws(() => planReplicas(0), /0 GPUs: a whole number of GPUs, 1 or more/);
  assert.throws(() => planReplicas(2.5), /2\.5 GPUs/);
  assert.throws(() => planReplicas(4, 4), /--learner-gpus 4 leaves none of the 4 GPUs for vLLM: at most 3/);
  assert.throws(() => planReplicas(1, 2), /--learner-gpus 2 on 1 GPU/);
  assert.throws(() => replicaOverrideYaml('services: {}\n', 2), /no vllm service/);
  assert.throws(() => replicaOverrideYaml(baseText.replace('- --gpu-memory-utilization\n', '- --gpu-memory-fraction\n'), 2), /no --gpu-memory-utilization value/);
});

test('halo compose-replicas 8 writes that override and prints the --policy-url list of its replicas', () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-replicas-'));
  try {
    const out = join(dir, 'replicas.yml');
    const r = spawnSync(process.execPath, ['--import', 'tsx', 'client/cli.ts', 'compose-replicas', '8', '--out', out], { cwd: REPO_ROOT, encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    const written = readFileSync(out, 'utf8');
    assert.equal(written, replicaOverrideYaml(baseText, 8, 1, out).text);
    assert.ok(!parseDocument(written).warnings.some((w) => !/!override/.test(w.message)), 'only the !override tag is outside plain YAML');
    assert.ok(isMap(parseDocument(written).getIn(['services', 'vllm-7', 'deploy'], true)));
    const urls = /--policy-url (\S+)/.exec(r.stdout)?.[1]?.split(',');
    assert.deepEqual(
      urls,
      ['vllm', ...[2, 3, 4, 5, 6, 7].map((i) => `vllm-${i}`)].map((h) => `http://${h}:8000/v1`),
    );
    const bad = spawnSync(process.execPath, ['--import', 'tsx', 'client/cli.ts', 'compose-replicas', '8', '--learner-gpus', '8', '--out', out], {
      cwd: REPO_ROOT,
      encoding: 'utf8',
    });
    assert.equal(bad.status, 2, 'a bad flag is a configuration error (exit 2)');
    assert.match(bad.stderr, /--learner-gpus 8 leaves none of the 8 GPUs for vLLM/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
