import { Command } from 'commander';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfigFile } from './lib/config-file';
import { parseConfig, type HaloConfig } from './lib/config';
import { REPO_ROOT } from './client/processes';
import * as viewCmd from './client/commands/view';
import * as reportCmd from './client/commands/report';
import * as configDocCmd from './client/commands/config-doc';
const DEFAULT_CONFIG = join(REPO_ROOT, 'configs', 'default.yaml');
function loadConfig(path?: string): HaloConfig {
  if (path) return loadConfigFile(path);
  return existsSync(DEFAULT_CONFIG) ? loadConfigFile(DEFAULT_CONFIG) : parseConfig({});
}
const program = new Command('halo').option('-c, --config <file>', 'config file (YAML)', undefined).showHelpAfterError();
for (const m of [viewCmd, reportCmd, configDocCmd]) m.register(program, { loadConfig });
program.parseAsync(process.argv).catch((err: Error) => { console.error(`halo: ${err.message}`); process.exit(1); });
