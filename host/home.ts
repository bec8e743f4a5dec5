/** The runs folder of this process: blobs, metrics and the in-flight ledgers live under it. */
export function haloHome(env: NodeJS.ProcessEnv = process.env, fallback = 'runs'): string {
  return env.HALO_HOME || fallback;
}
