import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join, normalize, resolve } from 'node:path';
import { parse as parseYaml } from 'yaml';
import { REPO_ROOT } from '../../client/processes';
import { parseConfig } from '../../lib/config/config';
import { identicalCandidatesProblem } from '../../lib/config/config-checks';
import { vllmStructuredOutputsConfig } from '../../lib/model-io/action-grammar';
import { VLLM_GRAMMAR_CALLS } from '../../lib/model-io/grammar-blob';
import { loadConfigFile } from '../../host/config-file';
import { CREDENTIAL_NAMES, DEFAULT_CREDENTIAL_ENV, INSECURE_HOSTS_ENV, credentialOverrideVar } from '../../lib/serving/credentials';
import { chromiumSandboxed } from '../../env/browser';

// docker-compose.yml for one GPU machine: checked against the repository (paths, Dockerfiles), against the
// code (every variable a worker gets is one it reads, and every one it needs is set), and for the properties
// the design relies on (runtime LoRA loading, same adapter path in learner and vLLM, restarts, GPUs).

interface Service {
  image?: string;
  build?: string | { context?: string; dockerfile?: string };
  command?: string | string[];
  entrypoint?: string | string[];
  environment?: Record<string, string | number | boolean | null> | string[];
  ports?: (string | number | { target: number; published?: string | number; host_ip?: string })[];
  volumes?: (string | { type?: string; source?: string; target: string; read_only?: boolean })[];
  restart?: string;
  depends_on?: string[] | Record<string, { condition?: string }>;
  deploy?: { resources?: { reservations?: { devices?: { driver?: string; count?: number | string; device_ids?: string[]; capabilities?: string[] }[] } } };
  stop_grace_period?: string;
  networks?: string[] | Record<string, unknown>;
  user?: string;
  network_mode?: string;
  security_opt?: string[];
  cap_drop?: string[];
}

interface Compose {
  services: Record<string, Service>;
  volumes?: Record<string, unknown>;
  networks?: Record<string, { internal?: boolean } | null>;
}

const COMPOSE_PATH = join(REPO_ROOT, 'docker-compose.yml');
const compose = parseYaml(readFileSync(COMPOSE_PATH, 'utf8')) as Compose;
const services = compose.services;

const NODE_WORKERS = ['control-worker', 'browser-worker'];
const PY_WORKERS = ['learner'];
const ONE_SHOTS = ['temporal-schema', 'temporal-namespace', 'shared-owner'];

function env(s: Service): Record<string, string> {
  const e = s.environment ?? {};
  if (Array.isArray(e)) return Object.fromEntries(e.map((kv) => [kv.split('=')[0], kv.includes('=') ? kv.slice(kv.indexOf('=') + 1) : '']));
  return Object.fromEntries(Object.entries(e).map(([k, v]) => [k, v === null ? '' : String(v)]));
}

function argv(x: string | string[] | undefined): string[] {
  if (x === undefined) return [];
  return Array.isArray(x) ? x.map(String) : x.split(/\s+/).filter(Boolean);
}

interface Mount {
  source: string;
  target: string;
  bind: boolean;
  readOnly: boolean;
}

function mounts(s: Service): Mount[] {
  return (s.volumes ?? []).map((v) => {
    if (typeof v === 'string') {
      const [source, target, mode] = v.split(':');
      assert.ok(target, `volume ${v} needs a target`);
      return { source, target, bind: /^(\.|\/|~)/.test(source), readOnly: mode === 'ro' };
    }
    return { source: v.source ?? '', target: v.target, bind: v.type === 'bind', readOnly: Boolean(v.read_only) };
  });
}

/** Files of the code base in `dirs` (recursively) with one of `exts`. */
function sources(dirs: string[], exts: string[]): string[] {
  const out: string[] = [];
  const walk = (d: string) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      if (e.name === 'node_modules' || e.name.startsWith('.') || e.name === '__pycache__') continue;
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (exts.some((x) => e.name.endsWith(x))) out.push(p);
    }
  };
  for (const d of dirs) walk(join(REPO_ROOT, d));
  return out;
}

/** Environment variables the TypeScript code reads (`process.env.X`, `process.env['X']`, `env.X` of a ProcessEnv). */
/** What @temporalio/envconfig reads for the connection (host/connection.ts hands it the environment). */
const ENVCONFIG_VARIABLES = [
  'TEMPORAL_CONFIG_FILE',
  'TEMPORAL_PROFILE',
  'TEMPORAL_ADDRESS',
  'TEMPORAL_NAMESPACE',
  'TEMPORAL_API_KEY',
  'TEMPORAL_TLS',
  'TEMPORAL_TLS_CLIENT_CERT_PATH',
  'TEMPORAL_TLS_CLIENT_KEY_PATH',
  'TEMPORAL_TLS_SERVER_CA_CERT_PATH',
  'TEMPORAL_TLS_SERVER_NAME',
];

function tsEnvReads(): Set<string> {
  const names = new Set<string>();
  for (const f of sources(['lib', 'env', 'blob', 'host', 'workflows', 'activities', 'workers', 'client'], ['.ts'])) {
    const text = readFileSync(f, 'utf8');
    for (const m of text.matchAll(/\b(?:process\.)?env(?:\.([A-Z][A-Z0-9_]*)|\[\s*['"]([A-Z][A-Z0-9_]*)['"]\s*\])/g)) names.add(m[1] ?? m[2]);
    if (text.includes("from '@temporalio/envconfig'")) for (const k of ENVCONFIG_VARIABLES) names.add(k);
  }
  // Named credentials: lib/serving/credentials.ts maps each name to a variable, read through a lookup.
  for (const v of Object.values(DEFAULT_CREDENTIAL_ENV)) names.add(v);
  for (const n of CREDENTIAL_NAMES) names.add(credentialOverrideVar(n));
  names.add(INSECURE_HOSTS_ENV);
  return names;
}

/** Environment variables the learner reads (`os.environ.get("X")`, `os.environ["X"]`, `env.get("X")`). */
function pyEnvReads(): Set<string> {
  const names = new Set<string>();
  for (const f of sources(['workers/learner/halo_learner'], ['.py'])) {
    const text = readFileSync(f, 'utf8');
    for (const m of text.matchAll(/\b(?:environ|env)(?:\.get\(\s*|\[\s*)["']([A-Z][A-Z0-9_]*)["']/g)) names.add(m[1]);
    if (text.includes('from temporalio.envconfig import')) for (const k of ENVCONFIG_VARIABLES) names.add(k);
  }
  return names;
}

test('the services of one GPU machine are all there, and every depends_on names one of them', () => {
  for (const name of ['postgres', 'temporal-schema', 'temporal', 'temporal-namespace', 'temporal-ui', 'vllm', ...NODE_WORKERS, ...PY_WORKERS]) {
    assert.ok(services[name], `service ${name} is missing`);
  }
  for (const [name, s] of Object.entries(services)) {
    assert.ok(s.image || s.build, `${name} has neither image nor build`);
    const deps = Array.isArray(s.depends_on) ? s.depends_on : Object.keys(s.depends_on ?? {});
    for (const d of deps) assert.ok(services[d], `${name} depends on unknown service ${d}`);
    if (s.depends_on && !Array.isArray(s.depends_on)) {
      for (const [d, c] of Object.entries(s.depends_on)) {
        if (c.condition === 'service_completed_successfully') assert.ok(ONE_SHOTS.includes(d), `${name} waits for ${d} to complete, but ${d} is not a one-shot`);
        if (c.condition === 'service_healthy')
          assert.ok((services[d] as { healthcheck?: unknown }).healthcheck, `${name} waits for ${d} to be healthy, but ${d} has no healthcheck`);
      }
    }
  }
  assert.match(services.temporal.image ?? '', /^temporalio\/server:/);
  assert.match(services['temporal-ui'].image ?? '', /^temporalio\/ui:/);
  assert.match(services.vllm.image ?? '', /^vllm\/vllm-openai:/);
});

test('build contexts, Dockerfiles and bind-mounted host paths exist in the repository', () => {
  // Folders the setup creates (launch.sh `mkdir -p ...`) count as existing: they are gitignored outputs.
  const launch = readFileSync(join(REPO_ROOT, 'launch.sh'), 'utf8');
  const created = new Set([...launch.matchAll(/mkdir -p ([^\n]+)/g)].flatMap((m) => m[1].trim().split(/\s+/)).map((p) => normalize(p)));
  let builds = 0;
  for (const [name, s] of Object.entries(services)) {
    if (s.build) {
      const b = typeof s.build === 'string' ? { context: s.build } : s.build;
      const context = resolve(REPO_ROOT, b.context ?? '.');
      assert.ok(existsSync(context) && statSync(context).isDirectory(), `${name}: build context ${b.context} is not a folder`);
      const dockerfile = resolve(context, b.dockerfile ?? 'Dockerfile');
      assert.ok(existsSync(dockerfile), `${name}: ${b.dockerfile} does not exist`);
      // BuildKit's per-Dockerfile ignore file keeps node_modules, .venv and runs out of the context.
      assert.ok(existsSync(`${dockerfile}.dockerignore`), `${name}: ${b.dockerfile}.dockerignore is missing`);
      builds++;
    }
    for (const m of mounts(s).filter((x) => x.bind)) {
      const host = normalize(m.source);
      assert.ok(!host.startsWith('..') && !host.startsWith('/'), `${name}: bind mount ${m.source} is outside the repository`);
      assert.ok(existsSync(join(REPO_ROOT, host)) || created.has(host), `${name}: bind-mounted ${m.source} does not exist in the repository`);
    }
  }
  assert.ok(builds >= 3);
  const node = readFileSync(join(REPO_ROOT, 'docker/node.Dockerfile'), 'utf8');
  assert.match(node, /^FROM node:20/m);
  assert.match(node, /apt-get install[^\n]*\\?\n?[^\n]*chromium/);
  assert.match(node, /npm ci/);
  assert.match(node, /miniwob==1\.1\.0/);
  assert.match(node, /agisdk==0\.3\.5/);
  assert.match(readFileSync(join(REPO_ROOT, 'docker/node.Dockerfile.dockerignore'), 'utf8'), /^node_modules$/m);
  const learner = readFileSync(join(REPO_ROOT, 'docker/learner.Dockerfile'), 'utf8');
  assert.match(learner, /pip install -r workers\/learner\/requirements\.txt/);
  assert.match(learner, /torch\.version\.cuda/, 'the learner image checks that torch is a CUDA build');
  // Without xgrammar a constrained update fails; its version is the one vLLM 0.33 pins (what grammar blobs record).
  assert.match(learner, /pip install --no-deps "xgrammar==\$\{XGRAMMAR_VERSION\}"/);
  assert.match(learner, new RegExp(`XGRAMMAR_VERSION=${VLLM_GRAMMAR_CALLS['vllm-0.33'].xgrammar.replace(/\./g, '\\.')}\\b`));
  const torchPin = /^torch==(\S+)$/m.exec(readFileSync(join(REPO_ROOT, 'workers/learner/requirements.txt'), 'utf8'))?.[1];
  assert.match(learner, new RegExp(`TORCH_VERSION=${torchPin!.replace(/\./g, '\\.')}\\b`), 'the same torch as requirements.txt');
});

function parsePort(p: string | number | { target: number; published?: string | number; host_ip?: string }): { ip?: string; host: number; container: number } {
  if (typeof p === 'object') return { ip: p.host_ip, host: Number(p.published), container: Number(p.target) };
  const m = /^(?:(\d{1,3}(?:\.\d{1,3}){3}|\[[0-9a-f:]+\]):)?(\d+):(\d+)(?:\/(tcp|udp))?$/.exec(String(p));
  assert.ok(m, `port ${p} is not [ip:]host:container[/proto]`);
  return { ip: m![1], host: Number(m![2]), container: Number(m![3]) };
}

test('ports are valid mappings, unique on the host, with the UI on 8233 and gRPC on 7233', () => {
  const hostPorts = new Map<number, string>();
  for (const [name, s] of Object.entries(services)) {
    for (const p of s.ports ?? []) {
      const { ip, host, container } = parsePort(p);
      for (const n of [host, container]) assert.ok(Number.isInteger(n) && n >= 1 && n <= 65535, `${name}: port ${n} out of range`);
      if (ip)
        assert.ok(
          ip.split('.').every((o) => Number(o) <= 255),
          `${name}: bad address ${ip}`,
        );
      assert.ok(!hostPorts.has(host), `host port ${host} used by ${hostPorts.get(host)} and ${name}`);
      hostPorts.set(host, name);
    }
  }
  assert.equal(hostPorts.get(7233), 'temporal');
  assert.equal(hostPorts.get(8233), 'temporal-ui');
  assert.deepEqual(parsePort(services['temporal-ui'].ports![0]).container, 8080);
  // The defaults of the config and the CLI point at these ports.
  const cfg = parseConfig({});
  assert.equal(Number(cfg.temporal.address.split(':').pop()), 7233);
  assert.equal(cfg.stack.uiPort, 8233);
  assert.equal(hostPorts.get(Number(new URL(cfg.policy.baseUrl).port)), 'vllm');
});

test('every variable a worker gets is one its code reads, and every variable it needs is set', () => {
  const ts = tsEnvReads();
  const py = pyEnvReads();
  // Sanity: the scans find what the code is known to read.
  for (const k of ['TEMPORAL_ADDRESS', 'TEMPORAL_NAMESPACE', 'HALO_HOME', 'HALO_CONTROL_QUEUE', 'HALO_BROWSER_QUEUE', 'HALO_CHROMIUM']) assert.ok(ts.has(k), `scan missed ${k}`);
  for (const k of ['TEMPORAL_ADDRESS', 'HALO_MODEL', 'HALO_CHECKPOINTS', 'HALO_GPU_QUEUE', 'HALO_HOME']) assert.ok(py.has(k), `scan missed ${k}`);

  const required: Record<string, string[]> = {
    'control-worker': ['TEMPORAL_ADDRESS', 'TEMPORAL_NAMESPACE', 'HALO_HOME', 'HALO_CONTROL_QUEUE', 'HALO_BROWSER_QUEUE'],
    'browser-worker': ['TEMPORAL_ADDRESS', 'TEMPORAL_NAMESPACE', 'HALO_HOME', 'HALO_BROWSER_QUEUE', 'HALO_CHROMIUM'],
    learner: ['TEMPORAL_ADDRESS', 'TEMPORAL_NAMESPACE', 'HALO_HOME', 'HALO_CHECKPOINTS', 'HALO_GPU_QUEUE', 'HALO_MODEL'],
    'temporal-namespace': ['TEMPORAL_ADDRESS', 'TEMPORAL_NAMESPACE'],
  };
  for (const [name, need] of Object.entries(required)) {
    const e = env(services[name]);
    const reads = PY_WORKERS.includes(name) ? py : ts;
    for (const k of Object.keys(e)) assert.ok(reads.has(k), `${name} sets ${k}, which its code never reads`);
    for (const k of need) assert.ok(e[k], `${name} does not set ${k}`);
  }

  // The values agree with the rest of the stack.
  const cfg = parseConfig({});
  const temporalPort = parsePort(services.temporal.ports![0]).container;
  for (const name of Object.keys(required)) {
    const e = env(services[name]);
    assert.equal(e.TEMPORAL_ADDRESS, `temporal:${temporalPort}`, `${name}: TEMPORAL_ADDRESS`);
    assert.equal(e.TEMPORAL_NAMESPACE, cfg.temporal.namespace, `${name}: TEMPORAL_NAMESPACE`);
  }
  for (const name of NODE_WORKERS) {
    const e = env(services[name]);
    assert.equal(e.HALO_CONTROL_QUEUE ?? cfg.temporal.controlTaskQueue, cfg.temporal.controlTaskQueue);
    assert.equal(e.HALO_BROWSER_QUEUE, cfg.temporal.browserTaskQueue);
  }
  const learner = env(services.learner);
  assert.equal(learner.HALO_GPU_QUEUE, cfg.train.gpuTaskQueue);
  // Blobs, metrics and adapters: each worker's HALO_HOME / HALO_CHECKPOINTS is a mounted folder, the same for all.
  const homeMount = (name: string, path: string) => mounts(services[name]).find((m) => m.target === path);
  for (const name of [...NODE_WORKERS, ...PY_WORKERS]) {
    const m = homeMount(name, env(services[name]).HALO_HOME);
    assert.ok(m && !m.readOnly, `${name}: HALO_HOME ${env(services[name]).HALO_HOME} is not a writable mount`);
    assert.equal(normalize(m!.source), 'runs', `${name}: HALO_HOME is not ./runs`);
  }
  const ck = homeMount('learner', learner.HALO_CHECKPOINTS);
  assert.ok(ck && !ck.readOnly, 'the learner writes adapters into a mounted folder');
});

test("vLLM serves the learner's model with runtime LoRA loading, and sees adapters at the learner's path", () => {
  const v = services.vllm;
  const args = [...argv(v.entrypoint), ...argv(v.command)];
  const flag = (name: string) => {
    const i = args.findIndex((a) => a === name || a.startsWith(`${name}=`));
    if (i < 0) return undefined;
    return args[i].includes('=') ? args[i].split('=')[1] : args[i + 1];
  };
  assert.ok(args.includes('--enable-lora'), '--enable-lora');
  // Compose substitutes the variable the learner reads too, so vLLM serves every adapter the learner writes.
  const rank = ['$', '{HALO_LORA_RANK:-16}'].join('');
  assert.equal(flag('--max-lora-rank'), rank);
  assert.equal(env(services.learner).HALO_LORA_RANK, rank);
  assert.ok(Number(flag('--max-loras')) >= 2, '--max-loras: the new adapter and the previous one');
  assert.equal(flag('--gpu-memory-utilization'), '0.5');
  // The sampler's log-probs are the learner's old log-probs: after temperature, as the learner computes them.
  assert.equal(flag('--logprobs-mode'), 'processed_logprobs');
  // Constrained decoding: the server's whitespace is the one the learner compiles by default (policy.grammarWhitespace).
  assert.equal(parseConfig({}).policy.grammarWhitespace, 'compact');
  assert.deepEqual(JSON.parse(flag('--structured-outputs-config') ?? 'null'), JSON.parse(vllmStructuredOutputsConfig('compact')));
  assert.match(env(v).VLLM_ALLOW_RUNTIME_LORA_UPDATING ?? '', /^true$/i);
  const learner = env(services.learner);
  assert.ok(args.includes(learner.HALO_MODEL), `vLLM serves ${learner.HALO_MODEL}, the learner's HALO_MODEL`);
  assert.equal(learner.HALO_MODEL, parseConfig({}).policy.model);
  // The learner reports adapter_path as it sees it; vLLM loads that path, so both mount the same folder there.
  const ckL = mounts(services.learner).find((m) => m.target === learner.HALO_CHECKPOINTS)!;
  const ckV = mounts(v).find((m) => m.target === learner.HALO_CHECKPOINTS);
  assert.ok(ckV, `vLLM does not mount ${learner.HALO_CHECKPOINTS}`);
  assert.equal(ckV!.source, ckL.source);
  // The HF cache is shared, so the 8B model is downloaded once.
  const hfV = mounts(v).find((m) => !m.bind && /hf/.test(m.source));
  const hfL = mounts(services.learner).find((m) => !m.bind && /hf/.test(m.source));
  assert.ok(hfV && hfL && hfV.source === hfL.source && hfV.target === hfL.target);
  // The port vLLM listens on is the one it publishes.
  assert.equal(flag('--port'), String(parsePort(v.ports![0]).container));
});

test('named volumes are declared; restart policies bring everything back after a reboot; GPUs are reserved', () => {
  const declared = new Set(Object.keys(compose.volumes ?? {}));
  for (const [name, s] of Object.entries(services)) {
    for (const m of mounts(s).filter((x) => !x.bind)) assert.ok(declared.has(m.source), `${name} uses undeclared volume ${m.source}`);
  }
  assert.ok(
    mounts(services.postgres).some((m) => !m.bind && m.target === '/var/lib/postgresql/data'),
    "Temporal's database is on a volume",
  );
  for (const [name, s] of Object.entries(services)) {
    if (ONE_SHOTS.includes(name)) assert.match(s.restart ?? '', /^on-failure/, `${name} (one-shot) restarts on failure`);
    else assert.ok(['unless-stopped', 'always'].includes(s.restart ?? ''), `${name} restart policy is ${s.restart}`);
  }
  for (const name of ['vllm', 'learner']) {
    const devices = services[name].deploy?.resources?.reservations?.devices ?? [];
    assert.ok(
      devices.some((d) => d.driver === 'nvidia' && (d.capabilities ?? []).includes('gpu')),
      `${name} reserves no GPU`,
    );
  }
  for (const name of ['control-worker', 'browser-worker', 'temporal', 'postgres']) {
    assert.equal(services[name].deploy?.resources?.reservations?.devices, undefined, `${name} needs no GPU`);
  }
  // The learner gets longer than its own drain time to finish a running update.
  const grace = Number(env(services.learner).HALO_SHUTDOWN_GRACE_S);
  const stop = /^(\d+)s$/.exec(services.learner.stop_grace_period ?? '');
  assert.ok(stop && Number(stop[1]) > grace, 'learner stop_grace_period exceeds HALO_SHUTDOWN_GRACE_S');
});

test("docker/compose-config.yaml's GRPO run explores: the seeds' N = 8 candidates at temperature 0.7, not 4 identical greedy ones", () => {
  const cfg = loadConfigFile(join(REPO_ROOT, 'docker/compose-config.yaml'));
  assert.deepEqual([cfg.train.numGenerations, cfg.policy.temperature], [8, 0.7]);
  assert.equal(identicalCandidatesProblem(cfg), undefined);
});

test('docker/compose-config.yaml points the policy and adapter loading at the vllm service', () => {
  const cfg = loadConfigFile(join(REPO_ROOT, 'docker/compose-config.yaml'));
  const vllmPort = parsePort(services.vllm.ports![0]).container;
  assert.equal(cfg.policy.backend, 'openai');
  assert.equal(new URL(cfg.policy.baseUrl).host, `vllm:${vllmPort}`);
  assert.equal(new URL(cfg.train.vllmBaseUrl!).host, `vllm:${vllmPort}`);
  assert.equal(cfg.train.gpuTaskQueue, env(services.learner).HALO_GPU_QUEUE);
  assert.equal(cfg.policy.model, env(services.learner).HALO_MODEL);
  // Every HTTP URL of the config (policy, adapter loading, critic, and any added later) is reached by a
  // worker inside the compose network, so none may be left at a 127.0.0.1 default.
  const urls: [string, string][] = [];
  const walk = (v: unknown, path: string) => {
    if (typeof v === 'string' && /^https?:\/\//.test(v)) urls.push([path, v]);
    else if (v && typeof v === 'object') for (const [k, x] of Object.entries(v)) walk(x, path ? `${path}.${k}` : k);
  };
  walk(cfg, '');
  assert.ok(urls.length >= 2);
  for (const [path, url] of urls) assert.equal(new URL(url).hostname, 'vllm', `${path} = ${url} is not reachable from the workers`);
});

test('teardown.sh stops gracefully, keeps volumes, and purges only after confirmation', () => {
  const path = join(REPO_ROOT, 'teardown.sh');
  assert.ok(statSync(path).mode & 0o111, 'teardown.sh is executable');
  const text = readFileSync(path, 'utf8');
  assert.equal(spawnSync('bash', ['-n', path]).status, 0, 'bash -n teardown.sh');
  assert.match(text, /docker compose stop/);
  assert.match(text, /--purge/);
  assert.match(text, /read -r/);
  assert.match(text, /down --volumes/);
  // Workers stop first, with a timeout at least as long as the learner's grace period.
  const timeout = Number(/HALO_STOP_TIMEOUT:-(\d+)/.exec(text)?.[1]);
  assert.ok(timeout >= Number(/^(\d+)s$/.exec(services.learner.stop_grace_period ?? '')?.[1]), 'stop timeout covers the learner');
  // Without a terminal and without --yes, --purge refuses instead of deleting.
  // (PATH leads nowhere, so it could not reach docker even if it tried.)
  const r = spawnSync('/bin/bash', [path, '--purge'], { input: '', encoding: 'utf8', env: { PATH: '/nonexistent' } });
  assert.equal(r.status, 1, r.stderr);
  assert.match(r.stderr, /refusing/);
  assert.doesNotMatch(r.stderr, /docker is not installed/);
  const bad = spawnSync('/bin/bash', [path, '--bogus'], { encoding: 'utf8', env: { PATH: '/nonexistent' } });
  assert.equal(bad.status, 2);
});

function networksOf(s: Service): string[] {
  return Array.isArray(s.networks) ? s.networks : Object.keys(s.networks ?? {});
}

test('vLLM requires the API key the control worker sends, and no browser origin may read its answers', () => {
  const v = services.vllm;
  const args = [...argv(v.entrypoint), ...argv(v.command)];
  const keyFromEnv = env(v).VLLM_API_KEY;
  const keyFlag = args.findIndex((a) => a === '--api-key' || a.startsWith('--api-key='));
  assert.ok(keyFromEnv || keyFlag >= 0, 'vLLM runs without --api-key / VLLM_API_KEY');
  // The key comes from the environment of `docker compose`, required (no default that would be a known key).
  assert.match(keyFromEnv ?? '', /^\$\{HALO_POLICY_API_KEY:\?[^}]+\}$/);
  const control = env(services['control-worker']);
  assert.equal(control[DEFAULT_CREDENTIAL_ENV.policy], keyFromEnv, 'the control worker sends the key vLLM requires (credential policy)');
  const critic = loadConfigFile(join(REPO_ROOT, 'docker/compose-config.yaml')).mcts.critic;
  assert.equal(critic.backend === 'openai' ? DEFAULT_CREDENTIAL_ENV[critic.credential] : DEFAULT_CREDENTIAL_ENV.policy, DEFAULT_CREDENTIAL_ENV.policy);
  // Plain http to vllm is allowed by name on the worker, and only that host.
  assert.deepEqual(
    control[INSECURE_HOSTS_ENV]?.split(',').map((h) => h.trim()),
    ['vllm'],
  );
  assert.equal(env(services['browser-worker'])[DEFAULT_CREDENTIAL_ENV.policy], undefined, 'the browser worker holds no key');
  const origins = args[args.indexOf('--allowed-origins') + 1];
  assert.ok(args.includes('--allowed-origins'), '--allowed-origins is not set: vLLM allows every origin by default');
  const list = JSON.parse(origins) as string[];
  assert.ok(Array.isArray(list) && !list.includes('*'), `--allowed-origins ${origins}`);
});

test('the browser worker reaches only Temporal and its own way out; vLLM, Postgres and the UI are elsewhere', () => {
  const declared = compose.networks ?? {};
  for (const [name, s] of Object.entries(services)) {
    const nets = networksOf(s);
    if (s.network_mode === 'none') continue;
    assert.ok(nets.length > 0, `${name} is on the default network (every service names its networks)`);
    for (const n of nets) assert.ok(n in declared, `${name} uses undeclared network ${n}`);
  }
  const browserNets = networksOf(services['browser-worker']);
  const members = (net: string) =>
    Object.entries(services)
      .filter(([, s]) => networksOf(s).includes(net))
      .map(([n]) => n);
  for (const other of ['vllm', 'postgres', 'temporal-ui']) {
    const shared = networksOf(services[other]).filter((n) => browserNets.includes(n));
    assert.deepEqual(shared, [], `browser-worker shares ${shared.join(', ')} with ${other}`);
  }
  assert.ok(
    networksOf(services.temporal).some((n) => browserNets.includes(n)),
    'the browser worker cannot reach Temporal',
  );
  for (const n of browserNets) {
    const internal = declared[n]?.internal === true;
    // A network with a way out is the browser's alone; the ones it shares have no way out.
    if (!internal) assert.deepEqual(members(n), ['browser-worker'], `egress network ${n} is shared with ${members(n).join(', ')}`);
  }
  // vLLM's own network, where the key is sent over plain http, is internal and holds only vLLM and the control worker.
  const keyNet = networksOf(services.vllm).filter((n) => networksOf(services['control-worker']).includes(n));
  assert.equal(keyNet.length, 1);
  assert.equal(declared[keyNet[0]]?.internal, true);
  assert.deepEqual(members(keyNet[0]).sort(), ['control-worker', 'vllm']);
  assert.equal(declared[networksOf(services.postgres)[0]]?.internal, true, "Postgres's network is internal");
});

test('Chromium runs as a non-root user with its sandbox on', () => {
  const node = readFileSync(join(REPO_ROOT, 'docker/node.Dockerfile'), 'utf8');
  const users = [...node.matchAll(/^USER\s+(\S+)/gm)].map((m) => m[1]);
  assert.ok(users.length > 0 && !['root', '0'].includes(users.at(-1)!.split(':')[0]), 'the node image ends as root');
  const b = services['browser-worker'];
  assert.ok(b.user && !/^(root|0)(:|$)/.test(b.user) && !/:-0}/.test(b.user), `browser-worker user ${b.user}`);
  assert.deepEqual(b.cap_drop, ['ALL']);
  assert.ok(b.security_opt?.includes('no-new-privileges:true'));
  assert.ok(!b.security_opt?.some((o) => /apparmor=unconfined|privileged/.test(o)));
  assert.equal((b as { privileged?: boolean }).privileged, undefined);
  // env/browser.ts passes --no-sandbox only to a browser started as root.
  assert.equal(chromiumSandboxed(1000), true);
  assert.equal(chromiumSandboxed(0), false);
  assert.doesNotMatch(readFileSync(join(REPO_ROOT, 'env/browser.ts'), 'utf8'), /'--no-sandbox'/);
});

test('every .dockerignore keeps environment files, keys and certificates out of the images', () => {
  const files = [
    join(REPO_ROOT, '.dockerignore'),
    ...readdirSync(join(REPO_ROOT, 'docker'))
      .filter((f) => f.endsWith('.dockerignore'))
      .map((f) => join(REPO_ROOT, 'docker', f)),
  ];
  assert.ok(files.length >= 3);
  for (const f of files) {
    const lines = new Set(
      readFileSync(f, 'utf8')
        .split('\n')
        .map((l) => l.trim()),
    );
    for (const p of ['.env*', '**/.env*', '**/*.pem', '**/*.key', '**/*.crt', '**/*.p12']) assert.ok(lines.has(p), `${f} lacks ${p}`);
    // A later "!" rule must not bring them back.
    for (const l of lines) assert.ok(!/^!.*(\.env|\.pem|\.key|\.crt)/.test(l), `${f}: ${l} re-includes secrets`);
  }
});

test("docker/compose-real.yaml: configs/grpo-real.yaml's training settings, with every URL on the vllm service", () => {
  const real = loadConfigFile(join(REPO_ROOT, 'docker/compose-real.yaml'));
  const seed = loadConfigFile(join(REPO_ROOT, 'configs/grpo-real.yaml'));
  const vllmPort = parsePort(services.vllm.ports![0]).container;
  assert.equal(real.episode.env, 'real');
  assert.equal(real.policy.backend, 'openai');
  assert.equal(new URL(real.policy.baseUrl).host, `vllm:${vllmPort}`);
  assert.equal(new URL(real.train.vllmBaseUrl!).host, `vllm:${vllmPort}`);
  assert.equal(real.policy.model, env(services.learner).HALO_MODEL, 'vLLM serves the model the learner trains');
  assert.equal(real.train.gpuTaskQueue, env(services.learner).HALO_GPU_QUEUE);
  assert.equal(real.temporal.controlTaskQueue, env(services['control-worker']).HALO_CONTROL_QUEUE);
  assert.equal(real.temporal.browserTaskQueue, env(services['browser-worker']).HALO_BROWSER_QUEUE);
  // The seed's hyperparameters: everything but the run id and the addresses.
  const strip = <T extends object>(o: T, keys: string[]) => Object.fromEntries(Object.entries(o).filter(([k]) => !keys.includes(k)));
  assert.deepEqual(strip(real.train, ['runId', 'vllmBaseUrl']), strip(seed.train, ['runId', 'vllmBaseUrl']));
  assert.deepEqual(strip(real.policy, ['baseUrl']), strip(seed.policy, ['baseUrl']));
  assert.deepEqual(real.episode, seed.episode);
  assert.deepEqual(real.real, seed.real);
  assert.deepEqual(real.rewards, seed.rewards);
  const urls: string[] = [];
  const walk = (v: unknown) => {
    if (typeof v === 'string' && /^https?:\/\//.test(v)) urls.push(v);
    else if (v && typeof v === 'object') for (const x of Object.values(v)) walk(x);
  };
  walk({ policy: real.policy, train: real.train });
  for (const url of urls) assert.equal(new URL(url).hostname, 'vllm', `${url} is not reachable from the workers`);
});

test(".venv-vllm and .venv-miniwob-official (the setup's other venvs) are git-ignored and kept out of every build context", () => {
  for (const venv of ['.venv-vllm', '.venv-miniwob-official']) {
    const git = spawnSync('git', ['check-ignore', '-q', `${venv}/bin/python`], { cwd: REPO_ROOT });
    assert.equal(git.status, 0, `${venv}/ is not git-ignored`);
  }
  // Docker's rules: the last matching line decides; `!` re-includes; `*` stays in one path segment, `**` spans them.
  const glob = (p: string) =>
    new RegExp(
      `^${p
        .replace(/^\/+/, '')
        .replace(/[.+^${}()|[\]\\]/g, '\\$&')
        .replace(/\*\*\/?/g, '\u0000')
        .replace(/\*/g, '[^/]*')
        .replace(/\?/g, '[^/]')
        .replaceAll('\u0000', '.*')}(/.*)?$`,
    );
  const ignored = (rules: string[], path: string) => {
    let out = false;
    for (const r of rules) {
      const neg = r.startsWith('!');
      if (glob(neg ? r.slice(1) : r).test(path)) out = !neg;
    }
    return out;
  };
  const files = [
    '.dockerignore',
    ...readdirSync(join(REPO_ROOT, 'docker'))
      .filter((f) => f.endsWith('.dockerignore'))
      .map((f) => `docker/${f}`),
  ];
  assert.ok(files.length >= 3);
  for (const f of files) {
    const rules = readFileSync(join(REPO_ROOT, f), 'utf8')
      .split('\n')
      .map((l) => l.trim())
      .filter((l) => l && !l.startsWith('#'));
    for (const venv of ['.venv', '.venv-vllm', '.venv-miniwob-official']) {
      assert.ok(ignored(rules, `${venv}/bin/python`), `${f} lets ${venv}/ into the build context`);
      assert.ok(rules.includes(venv), `${f} does not name ${venv}`);
    }
    assert.ok(!ignored(rules, 'client/cli.ts') || f.includes('learner'), `${f} drops the sources`);
  }
});

test('every worker serves its SDK metrics: control and browser workers and the learner bind HALO_METRICS_ADDRESS', () => {
  for (const name of [...NODE_WORKERS, ...PY_WORKERS]) {
    const address = env(services[name]).HALO_METRICS_ADDRESS;
    // 0.0.0.0: a Prometheus on the compose network reaches it; a loopback bind would serve only the container itself.
    assert.match(address ?? '', /^0\.0\.0\.0:\d+$/, `${name}: HALO_METRICS_ADDRESS ${address}`);
  }
});

// biome-ignore lint/suspicious/noTemplateCurlyInString: compose's interpolation, not a template
const STACK_USER = '${HALO_UID:-1000}:${HALO_GID:-1000}';

test('every service that reads or writes ./runs, ./checkpoints or the model cache runs as the one uid:gid, after shared-owner hands them over', () => {
  const shared = (s: Service) => (s.volumes ?? []).some((v) => /^(\.\/runs|\.\/checkpoints|hf-cache):/.test(typeof v === 'string' ? v : `${v.source}:`));
  const users = Object.entries(services).filter(([name, s]) => shared(s) && name !== 'shared-owner');
  assert.deepEqual(users.map(([name]) => name).sort(), ['browser-worker', 'control-worker', 'learner', 'vllm']);
  for (const [name, s] of users) {
    assert.equal(s.user, STACK_USER, `${name} runs as ${s.user ?? 'the image user (root for the learner and vLLM)'}`);
    const deps = s.depends_on && !Array.isArray(s.depends_on) ? s.depends_on : {};
    assert.equal(deps['shared-owner']?.condition, 'service_completed_successfully', `${name} starts before shared-owner has handed the folders over`);
  }
  const owner = services['shared-owner'];
  assert.equal(owner.user, '0:0');
  assert.equal(env(owner).HALO_OWNER, STACK_USER);
  const script = argv(owner.command).join(' ');
  for (const path of ['/hf-cache', '/app/runs', '/app/checkpoints']) assert.ok(script.includes(path), `shared-owner leaves ${path} alone`);
  assert.match(script, /-user 0 -exec chown -h "\$\$HALO_OWNER"/, 'only what root wrote changes owner');
  // Not root, so HOME must be somewhere that uid can write: the image's ENV for the learner, the service's for vLLM.
  assert.match(readFileSync(join(REPO_ROOT, 'docker', 'learner.Dockerfile'), 'utf8'), /^\s*HOME=\/tmp\b/m);
  assert.equal(env(services.vllm).HOME, '/tmp');
});
