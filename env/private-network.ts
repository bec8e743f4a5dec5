import { lookup } from 'node:dns/promises';
import { isIP } from 'node:net';

/**
 * Addresses a page from the web must not reach from a browser worker: loopback, private, link-local (cloud
 * metadata at 169.254.169.254), carrier-grade NAT, unspecified, multicast and reserved ranges, in IPv4 and
 * IPv6 (IPv4-mapped IPv6 addresses are judged as IPv4).
 */
export function isPrivateAddress(ip: string): boolean {
  const addr = ip.replace(/^\[|\]$/g, '').toLowerCase();
  const v = isIP(addr);
  if (v === 4) return privateV4(addr.split('.').map(Number));
  if (v !== 6) return false;
  const mapped = /^(?:0{0,4}:){0,5}:?ffff:(\d+\.\d+\.\d+\.\d+)$/.exec(addr) ?? /^::(\d+\.\d+\.\d+\.\d+)$/.exec(addr);
  if (mapped) return privateV4(mapped[1].split('.').map(Number));
  const hextets = expandV6(addr);
  if (!hextets) return true;
  const [a, b] = hextets;
  if (hextets.every((h) => h === 0)) return true; // ::
  if (hextets.slice(0, 7).every((h) => h === 0) && hextets[7] === 1) return true; // ::1
  if (hextets.slice(0, 5).every((h) => h === 0) && hextets[5] === 0xffff) return privateV4([hextets[6] >> 8, hextets[6] & 255, hextets[7] >> 8, hextets[7] & 255]);
  if ((a & 0xfe00) === 0xfc00) return true; // fc00::/7 unique local
  if ((a & 0xffc0) === 0xfe80) return true; // fe80::/10 link-local
  if ((a & 0xffc0) === 0xfec0) return true; // fec0::/10 site-local (deprecated)
  if ((a & 0xff00) === 0xff00) return true; // multicast
  if (a === 0x64 && b === 0xff9b) return privateV4([hextets[6] >> 8, hextets[6] & 255, hextets[7] >> 8, hextets[7] & 255]); // NAT64
  if (a === 0x2002) return privateV4([b >> 8, b & 255, hextets[2] >> 8, hextets[2] & 255]); // 6to4
  return false;
}

function privateV4([a, b]: number[]): boolean {
  return (
    a === 0 || // 0.0.0.0/8
    a === 10 ||
    a === 127 ||
    (a === 100 && b >= 64 && b <= 127) || // 100.64.0.0/10
    (a === 169 && b === 254) ||
    (a === 172 && b >= 16 && b <= 31) ||
    (a === 192 && b === 168) ||
    (a === 192 && b === 0) || // 192.0.0.0/24 (and TEST-NET-1 next to it)
    (a === 198 && (b === 18 || b === 19)) ||
    a >= 224 // multicast, reserved, broadcast
  );
}

function expandV6(addr: string): number[] | null {
  const [head, tail, extra] = addr.split('::');
  if (extra !== undefined) return null;
  const parse = (s: string) => (s ? s.split(':').map((h) => parseInt(h, 16)) : []);
  const h = parse(head);
  const t = tail === undefined ? [] : parse(tail);
  const fill = 8 - h.length - t.length;
  if (tail === undefined ? fill !== 0 : fill < 0) return null;
  const out = [...h, ...new Array(fill).fill(0), ...t];
  return out.length === 8 && out.every((x) => Number.isInteger(x) && x >= 0 && x <= 0xffff) ? out : null;
}

/** Host names that always mean this machine or its local network, whatever DNS says. */
function isLocalName(host: string): boolean {
  return host === 'localhost' || host.endsWith('.localhost') || host.endsWith('.local') || host.endsWith('.internal') || host.endsWith('.home.arpa');
}

const RESOLVED_TTL_MS = 60_000;
const resolved = new Map<string, { at: number; private: Promise<boolean> }>();

/**
 * Whether a request to `url` would reach a private, loopback or link-local address: an address literal is
 * judged as is, a local name always, any other name by what it resolves to (cached for a minute; a name that
 * does not resolve is not private: the browser's own lookup fails too). Non-http(s) URLs (data:, blob:) reach
 * no address.
 */
export async function reachesPrivateNetwork(url: string, resolve: (host: string) => Promise<string[]> = resolveAll): Promise<boolean> {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return false;
  }
  if (!['http:', 'https:', 'ws:', 'wss:', 'ftp:'].includes(u.protocol)) return false;
  const host = u.hostname.replace(/^\[|\]$/g, '').toLowerCase().replace(/\.$/, '');
  if (isIP(host)) return isPrivateAddress(host);
  if (isLocalName(host)) return true;
  const now = Date.now();
  const hit = resolved.get(host);
  if (hit && now - hit.at < RESOLVED_TTL_MS) return hit.private;
  const verdict = resolve(host).then(
    (ips) => ips.some(isPrivateAddress),
    () => false,
  );
  resolved.set(host, { at: now, private: verdict });
  if (resolved.size > 10_000) resolved.delete(resolved.keys().next().value!);
  return verdict;
}

async function resolveAll(host: string): Promise<string[]> {
  return (await lookup(host, { all: true, verbatim: true })).map((a) => a.address);
}
