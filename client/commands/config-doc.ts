import type { Command } from 'commander';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { z } from 'zod';
import { configSchema, type HaloConfig } from '../../lib/config/config';
import { REPO_ROOT } from '../processes';

// docs/CONFIG.md is generated from the one zod config schema (lib/config/config.ts): its JSON Schema (zod 4's
// public `z.toJSONSchema`, input side, so defaults are shown and defaulted keys are optional) is walked into
// one markdown table per section. `halo config-doc --write` regenerates it; a unit test keeps it in sync.

export const CONFIG_DOC_PATH = join(REPO_ROOT, 'docs', 'CONFIG.md');

interface JsonSchema {
  type?: string | string[];
  properties?: Record<string, JsonSchema>;
  required?: string[];
  items?: JsonSchema;
  enum?: unknown[];
  const?: unknown;
  default?: unknown;
  description?: string;
  minimum?: number;
  maximum?: number;
  exclusiveMinimum?: number;
  exclusiveMaximum?: number;
  minLength?: number;
  maxLength?: number;
  minItems?: number;
  maxItems?: number;
  pattern?: string;
  format?: string;
  anyOf?: JsonSchema[];
  additionalProperties?: boolean | JsonSchema;
}

export interface ConfigKeyDoc {
  /** Dotted path, e.g. `policy.baseUrl`. */
  path: string;
  type: string;
  /** Rendered default, or `(unset)` for an optional key without one. */
  default: string;
  description: string;
}

export interface ConfigSectionDoc {
  /** Dotted path of the section, e.g. `policy` or `rewards.sites.gomail`. */
  path: string;
  keys: ConfigKeyDoc[];
}

/** Section notes that the schema cannot carry (how the config loader reads a section). */
const SECTION_NOTES: Record<string, string> = {
  rewards:
    'Dense reward weights. In a config file, `rewards:` may also name a YAML file with these keys, relative to the config file ' +
    '(`configs/default.yaml` has `rewards: rewards.yaml`).',
};

const MAX_SAFE = Number.MAX_SAFE_INTEGER;

function isObjectSchema(s: JsonSchema): boolean {
  return s.type === 'object' && s.properties !== undefined;
}

function bounds(s: JsonSchema): string {
  const lo = s.minimum !== undefined && s.minimum > -MAX_SAFE ? s.minimum : undefined;
  const hi = s.maximum !== undefined && s.maximum < MAX_SAFE ? s.maximum : undefined;
  if (lo !== undefined && hi !== undefined) return lo < 0 ? `${lo} to ${hi}` : `${lo}–${hi}`;
  const parts: string[] = [];
  if (lo !== undefined) parts.push(`≥ ${lo}`);
  if (s.exclusiveMinimum !== undefined) parts.push(`> ${s.exclusiveMinimum}`);
  if (hi !== undefined) parts.push(`≤ ${hi}`);
  if (s.exclusiveMaximum !== undefined) parts.push(`< ${s.exclusiveMaximum}`);
  return parts.join(', ');
}

/** A short type text: `integer (1–65535)`, `"openai" \| "colocated"`, `string[] (≥ 1 item)`, `string (URL)`. */
export function describeType(s: JsonSchema): string {
  if (s.const !== undefined) return JSON.stringify(s.const);
  if (s.enum) return s.enum.map((v) => JSON.stringify(v)).join(' | ');
  if (s.anyOf) return s.anyOf.map(describeType).join(' or ');
  const type = Array.isArray(s.type) ? s.type.join(' or ') : (s.type ?? 'any');
  if (type === 'integer' || type === 'number') {
    const b = bounds(s);
    return b ? `${type} (${b})` : type;
  }
  if (type === 'string') {
    const notes: string[] = [];
    if (s.format === 'uri') notes.push('URL');
    else if (s.format) notes.push(s.format);
    if (s.pattern) notes.push(`matching \`${s.pattern}\``);
    else if (s.minLength === 1) notes.push('non-empty');
    else if (s.minLength !== undefined) notes.push(`≥ ${s.minLength} chars`);
    if (s.maxLength !== undefined) notes.push(`≤ ${s.maxLength} chars`);
    return notes.length ? `string (${notes.join(', ')})` : 'string';
  }
  if (type === 'array') {
    const inner = s.items ? describeType(s.items) : 'any';
    const m = /^([a-z]+)(?: \((.*)\))?$/.exec(inner);
    const item = m ? `${m[1]}[]` : `list of ${inner}`;
    const notes: string[] = m?.[2] ? [`items ${m[2]}`] : [];
    if (s.minItems !== undefined && s.minItems > 0) notes.push(`≥ ${s.minItems} item${s.minItems === 1 ? '' : 's'}`);
    if (s.maxItems !== undefined) notes.push(`≤ ${s.maxItems} items`);
    return notes.length ? `${item} (${notes.join(', ')})` : item;
  }
  return type;
}

function renderDefault(s: JsonSchema, required: boolean): string {
  if (s.default === undefined) return required ? '(required)' : '(unset)';
  return `\`${JSON.stringify(s.default)}\``;
}

/** The config schema as sections of keys (nested objects become their own sections). */
export function configSections(): ConfigSectionDoc[] {
  const root = z.toJSONSchema(configSchema, { io: 'input', unrepresentable: 'any' }) as JsonSchema;
  const sections: ConfigSectionDoc[] = [];
  const walk = (schema: JsonSchema, path: string) => {
    const keys: ConfigKeyDoc[] = [];
    const nested: [JsonSchema, string][] = [];
    const required = new Set(schema.required ?? []);
    for (const [name, prop] of Object.entries(schema.properties ?? {})) {
      const p = path ? `${path}.${name}` : name;
      if (isObjectSchema(prop)) nested.push([prop, p]);
      else keys.push({ path: p, type: describeType(prop), default: renderDefault(prop, required.has(name)), description: prop.description ?? '' });
    }
    if (keys.length) sections.push({ path, keys });
    for (const [s, p] of nested) walk(s, p);
  };
  for (const [name, prop] of Object.entries(root.properties ?? {})) {
    if (isObjectSchema(prop)) walk(prop, name);
    else sections.push({ path: name, keys: [{ path: name, type: describeType(prop), default: renderDefault(prop, false), description: prop.description ?? '' }] });
  }
  return sections;
}

function cell(s: string): string {
  return s.replace(/\|/g, '\\|').replace(/\r?\n/g, ' ');
}

/** The markdown of docs/CONFIG.md. */
export function renderConfigReference(): string {
  const sections = configSections();
  const out: string[] = [
    '<!-- Generated from lib/config/config.ts by `npx halo config-doc --write`; do not edit by hand (test/unit/config-doc.test.ts checks it). -->',
    '',
    '# Configuration reference',
    '',
    'One YAML file (`--config`, default `configs/default.yaml`) validated by one zod schema (`lib/config/config.ts`).',
    'Every key is optional: a missing key takes its default, and an unknown or invalid key is an error that names it by its dotted path (an unknown key also names the closest valid one: `train.iteratons: unknown key; did you mean train.iterations?`). Every number has an upper bound.',
    'Command-line flags override the file.',
    '',
  ];
  const tops = [...new Set(sections.map((s) => s.path.split('.')[0]))];
  out.push('Sections: ' + tops.map((t) => `[\`${t}\`](#${t})`).join(', ') + '.', '');
  let currentTop = '';
  for (const sec of sections) {
    const top = sec.path.split('.')[0];
    if (top !== currentTop) {
      currentTop = top;
      out.push(`## ${top}`, '');
      if (SECTION_NOTES[top]) out.push(SECTION_NOTES[top], '');
    }
    if (sec.path !== top) out.push(`### ${sec.path}`, '');
    out.push('| key | type | default | description |', '|---|---|---|---|');
    for (const k of sec.keys) out.push(`| \`${k.path}\` | ${cell(k.type)} | ${cell(k.default)} | ${cell(k.description)} |`);
    out.push('');
  }
  return out.join('\n');
}

export function register(program: Command, _ctx: { loadConfig: (path?: string) => HaloConfig }): void {
  program
    .command('config-doc')
    .description('print the configuration reference (markdown) generated from the config schema')
    .option('--check', `exit non-zero when docs/CONFIG.md is not the generated text`)
    .option('--write', 'write docs/CONFIG.md')
    .action((opts: { check?: boolean; write?: boolean }) => {
      const text = renderConfigReference();
      if (opts.write) {
        mkdirSync(dirname(CONFIG_DOC_PATH), { recursive: true });
        writeFileSync(CONFIG_DOC_PATH, text);
        console.log(`wrote ${CONFIG_DOC_PATH}`);
        return;
      }
      if (opts.check) {
        const current = existsSync(CONFIG_DOC_PATH) ? readFileSync(CONFIG_DOC_PATH, 'utf8') : undefined;
        if (current !== text) {
          throw new Error(`${CONFIG_DOC_PATH} is ${current === undefined ? 'missing' : 'stale'}: regenerate it with \`npx halo config-doc --write\``);
        }
        console.log(`${CONFIG_DOC_PATH} is up to date`);
        return;
      }
      process.stdout.write(text);
    });
}
