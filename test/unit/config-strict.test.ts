import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { z } from 'zod';
import { ConfigError, configSchema, parseConfig, parseStoredConfig } from '../../lib/config/config';
import { closestKey } from '../../lib/config/config-error';
import { evalConfigSchema, parseEvalConfig } from '../../lib/eval/eval-config';
import { parseRewardWeights, rewardWeightsSchema } from '../../lib/rewards/weights';
import { loadConfigFile } from '../../host/config-file';
import { loadEvalConfigFile } from '../../host/eval-config-file';
import { loadRewardWeights } from '../../host/rewards-file';

const CONFIGS = join(__dirname, '..', '..', 'configs');

function configErrorOf(f: () => unknown): string {
  try {
    f();
  } catch (err) {
    assert.ok(err instanceof ConfigError, `expected a ConfigError, got ${String(err)}`);
    return err.message;
  }
  assert.fail('expected a ConfigError');
}

test('a typo in a section is an error naming its full path and the closest valid key', () => {
  const msg = configErrorOf(() => parseConfig({ train: { iteratons: 5 }, mcts: { numSimulatons: 5 } }));
  assert.match(msg, /train\.iteratons: unknown key; did you mean train\.iterations\?/);
  assert.match(msg, /mcts\.numSimulatons: unknown key; did you mean mcts\.numSimulations\?/);
  assert.match(
    configErrorOf(() => parseConfig({ mcts: { critic: { tempertaure: 0 } } })),
    /mcts\.critic\.tempertaure: unknown key; did you mean mcts\.critic\.temperature\?/,
  );
  assert.match(
    configErrorOf(() => parseConfig({ polcy: {} })),
    /polcy: unknown key; did you mean policy\?/,
  );
  // Nothing close: the valid keys are listed instead.
  assert.match(
    configErrorOf(() => parseConfig({ episode: { zzzzzzzz: 1 } })),
    /episode\.zzzzzzzz: unknown key \(valid keys here: env, task, seed/,
  );
});

test('every section, nested ones included, rejects an unknown key', () => {
  const root = z.toJSONSchema(configSchema, { io: 'input', unrepresentable: 'any' }) as JsonSchema;
  const sections = objectPaths(root, []);
  assert.ok(sections.length >= 10, `found only ${sections.length} sections`);
  for (const path of sections) {
    const raw: Record<string, unknown> = {};
    let at = raw;
    for (const seg of path) {
      const next: Record<string, unknown> = {};
      at[seg] = next;
      at = next;
    }
    at.notAKey = 1;
    const where = [...path, 'notAKey'].join('.');
    assert.throws(
      () => parseConfig(raw),
      (err: Error) => err.message.includes(`${where}: unknown key`),
      `${where} was accepted`,
    );
  }
});

test('eval configs and reward weights name the closest valid key too', () => {
  const msg = configErrorOf(() =>
    parseEvalConfig({
      seed: [1],
      modes: [
        { name: 'qwen3vl_mcts', testTimeMcts: { simulatons: 3 } },
        { name: 'qwen3vl_base', adapter: { run: 'a', versoin: 1 } },
      ],
    }),
  );
  assert.match(msg, /^ {2}seed: unknown key; did you mean seeds\?/m);
  assert.match(msg, /modes\.0\.testTimeMcts\.simulatons: unknown key; did you mean modes\.0\.testTimeMcts\.simulations\?/);
  assert.match(msg, /modes\.1\.adapter\.versoin: unknown key; did you mean modes\.1\.adapter\.version\?/);
  // The keys of the mode named, not of every mode: the baseline has no adapter.
  assert.match(
    configErrorOf(() => parseEvalConfig({ modes: [{ name: 'openai_baseline', adapter: { run: 'x' } }] })),
    /modes\.0\.adapter: unknown key \(valid keys here: name, label, model/,
  );
  assert.match(
    configErrorOf(() => parseRewardWeights({ general: { valid_actoin: 1 } })),
    /general\.valid_actoin: unknown general weight .*did you mean general\.valid_action\?/,
  );
  assert.match(
    configErrorOf(() => parseConfig({ rewards: { sites: { gomail: { compose_openned: 1 } } } })),
    /rewards\.sites\.gomail\.compose_openned: .*did you mean rewards\.sites\.gomail\.compose_opened\?/,
  );
});

test('closestKey: case, a letter or two, snake_case; nothing for a word far from every key', () => {
  assert.equal(closestKey('iteratons', ['iterations', 'tasks']), 'iterations');
  assert.equal(closestKey('LearningRate', ['learningRate']), 'learningRate');
  assert.equal(closestKey('learning_rate', ['learningRate']), 'learningRate');
  assert.equal(closestKey('banana', ['iterations', 'tasks']), undefined);
  assert.equal(closestKey('x', []), undefined);
});

test('every number of every YAML-loaded schema has an upper bound; 1e15 ms is rejected', () => {
  const schemas: [string, z.ZodType][] = [
    ['config', configSchema],
    ['eval config', evalConfigSchema],
    ['reward weights', rewardWeightsSchema],
  ];
  for (const [name, schema] of schemas) {
    const unbounded = numberLeaves(z.toJSONSchema(schema, { io: 'input', unrepresentable: 'any' }) as JsonSchema, name).filter(
      ([, s]) => !(Number.isFinite(s.maximum) && (s.maximum as number) < Number.MAX_SAFE_INTEGER) && s.exclusiveMaximum === undefined,
    );
    assert.deepEqual(
      unbounded.map(([p]) => p),
      [],
      'numbers without an upper bound',
    );
  }
  const msFields: string[] = [];
  const root = z.toJSONSchema(configSchema, { io: 'input', unrepresentable: 'any' }) as JsonSchema;
  for (const [path] of numberLeaves(root, '')) if (/Ms$|TimeoutS$/.test(path)) msFields.push(path.slice(1));
  assert.ok(msFields.length >= 5, `timeouts found: ${msFields.join(', ')}`);
  for (const path of msFields) {
    const raw: Record<string, unknown> = {};
    const segs = path.split('.');
    let at = raw;
    for (const seg of segs.slice(0, -1)) {
      const next: Record<string, unknown> = {};
      at[seg] = next;
      at = next;
    }
    at[segs[segs.length - 1]] = 1e15;
    assert.throws(() => parseConfig(raw), new RegExp(`${path.replace(/\./g, '\\.')}: Too big`), `${path}: 1e15 accepted`);
  }
  assert.throws(() => parseConfig({ miniwob: { timeLimit: 1e15 } }), /miniwob\.timeLimit/);
  assert.throws(() => parseConfig({ train: { learningRate: 5 } }), /train\.learningRate: Too big/);
  assert.throws(() => parseEvalConfig({ seeds: [1e15] }), /seeds\.0: Too big/);
});

test('every file in configs/ is valid', () => {
  const files = readdirSync(CONFIGS).filter((f) => /\.ya?ml$/.test(f));
  assert.ok(files.length >= 5, files.join(', '));
  for (const f of files) {
    const path = join(CONFIGS, f);
    if (f.startsWith('eval-')) {
      const { config, haloConfigPath } = loadEvalConfigFile(path);
      assert.ok(config.modes.length > 0);
      if (haloConfigPath) loadConfigFile(haloConfigPath);
    } else if (f.startsWith('rewards')) {
      loadRewardWeights(path);
    } else {
      loadConfigFile(path);
    }
  }
});

test('a config stored by an earlier version drops keys the schema no longer has; other errors still fail', () => {
  const stored = { policy: { model: 'm', n: 1 }, mcts: { critic: { gone: true } }, train: { iterations: 4 } };
  const { cfg, dropped } = parseStoredConfig(stored);
  assert.equal(cfg.policy.model, 'm');
  assert.equal(cfg.train.iterations, 4);
  assert.deepEqual(dropped.sort(), ['mcts.critic.gone', 'policy.n']);
  assert.equal((stored.policy as Record<string, unknown>).n, 1, 'the input is left as it was');
  assert.throws(() => parseStoredConfig({ policy: { n: 1, temperature: 9 } }), /policy\.temperature/);
  assert.throws(() => parseConfig(stored), /policy\.n: unknown key/);
});

// ---- JSON Schema walking (zod 4's z.toJSONSchema) ----

interface JsonSchema {
  type?: string | string[];
  properties?: Record<string, JsonSchema>;
  items?: JsonSchema;
  anyOf?: JsonSchema[];
  oneOf?: JsonSchema[];
  maximum?: number;
  exclusiveMaximum?: number;
}

function objectPaths(s: JsonSchema, path: string[]): string[][] {
  if (!s.properties) return [];
  const out = [path];
  for (const [k, v] of Object.entries(s.properties)) out.push(...objectPaths(v, [...path, k]));
  return out;
}

function numberLeaves(s: JsonSchema, path: string): [string, JsonSchema][] {
  const out: [string, JsonSchema][] = [];
  const types = Array.isArray(s.type) ? s.type : [s.type];
  if (types.includes('number') || types.includes('integer')) out.push([path, s]);
  for (const [k, v] of Object.entries(s.properties ?? {})) out.push(...numberLeaves(v, `${path}.${k}`));
  if (s.items) out.push(...numberLeaves(s.items, `${path}[]`));
  for (const v of [...(s.anyOf ?? []), ...(s.oneOf ?? [])]) out.push(...numberLeaves(v, path));
  return out;
}
