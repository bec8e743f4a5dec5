import { stat } from 'node:fs/promises';
import { ApplicationFailure } from '@temporalio/activity';
import { clipErrorText } from '../lib/serving/credentials';
import { adapterFolderDamage } from '../host/adapter-manifest';

/**
 * Refuses, non-retryably, to hand vLLM an adapter folder whose manifest does not match its files. A folder this
 * worker cannot see (a vLLM on another host with its own mount) is left for vLLM to find or refuse by its own words.
 */
export async function checkAdapterFolder(path: string, name: string): Promise<void> {
  const isDir = await stat(path).then(
    (s) => s.isDirectory(),
    () => false,
  );
  if (!isDir) return;
  const why = await adapterFolderDamage(path);
  if (why === undefined) return;
  throw ApplicationFailure.create({
    message:
      `adapter ${name} at ${path} is damaged: ${clipErrorText(why)}; it was not handed to vLLM. The learner writes a damaged ` +
      'version again when it next updates that version (the damaged copy goes to <run>/.damaged/); for an older version, ' +
      'restore the folder or evaluate another version',
    type: 'AdapterDamaged',
    nonRetryable: true,
  });
}
