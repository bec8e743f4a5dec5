import { readFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { parse as parseYaml } from 'yaml';
import { ConfigError, parseConfig, type HaloConfig } from '../lib/config/config';

function readYaml(path: string, what: string): unknown {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    throw new ConfigError(`cannot read ${what} ${path}: ${(err as Error).message}`);
  }
  try {
    return parseYaml(text);
  } catch (err) {
    throw new ConfigError(`${what} ${path} is not valid YAML: ${(err as Error).message}`);
  }
}

export function loadConfigFile(path: string): HaloConfig {
  return parseConfig(readConfigRaw(path), `config file ${path}`);
}

/** A config file as a plain object before validation (`rewards: <file>` read in), for command-line overrides. */
export function readConfigRaw(path: string): unknown {
  let raw = readYaml(path, 'config file');
  // `rewards: <file>` points at a weights file (like configs/rewards.yaml), relative to this config file.
  if (raw && typeof raw === 'object' && typeof (raw as { rewards?: unknown }).rewards === 'string') {
    const file = resolve(dirname(path), (raw as { rewards: string }).rewards);
    raw = { ...(raw as object), rewards: readYaml(file, 'rewards file') };
  }
  return raw;
}
