/**
 * The REAL harness endpoints (/config, /finish, /submit) as a server may route them. The agent's navigation
 * guard (env/real-guard.ts) refuses them; a check on the raw path alone would let `/%66inish`, `/FINISH`,
 * `//finish/` or `/a/%2e%2e/finish` through, which the clone's server answers as /finish. So the path is
 * normalised first: percent-decoded (repeatedly, for double encoding), backslashes as slashes, dot segments
 * resolved, repeated and trailing slashes dropped, `;params` cut, lower case.
 */

const HARNESS = new Set(['/config', '/finish', '/submit']);

/** The path as the harness check sees it (see above); `/` for an empty path. */
export function normalisedPath(pathname: string): string {
  let p = pathname;
  for (let i = 0; i < 4; i++) {
    let decoded: string;
    try {
      decoded = decodeURIComponent(p);
    } catch {
      // A lone `%` is not an escape: decode what can be decoded.
      decoded = p.replace(/%[0-9a-f]{2}/gi, (m) => String.fromCharCode(parseInt(m.slice(1), 16)));
    }
    if (decoded === p) break;
    p = decoded;
  }
  p = p.replace(/\\/g, '/').toLowerCase();
  const out: string[] = [];
  for (const raw of p.split('/')) {
    const seg = raw.split(';')[0].trim();
    if (seg === '' || seg === '.') continue;
    if (seg === '..') out.pop();
    else out.push(seg);
  }
  return '/' + out.join('/');
}

/** Whether `pathname` names one of the harness endpoints, however it is spelt. */
export function isHarnessPath(pathname: string): boolean {
  return HARNESS.has(normalisedPath(pathname));
}
