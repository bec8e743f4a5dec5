import { readFileSync } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import { ConfigError, parseConfig, type HaloConfig } from './config';

export function loadConfigFile(path: string): HaloConfig {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    throw new ConfigError(`cannot read config file ${path}: ${(err as Error).message}`);
  }
  let raw: unknown;
  try {
    raw = parseYaml(text);
  } catch (err) {
    throw new ConfigError(`config file ${path} is not valid YAML: ${(err as Error).message}`);
  }
  return parseConfig(raw, `config file ${path}`);
}
