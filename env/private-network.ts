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
  const host = u.hostname
    .replace(/^\[|\]$/g, '')
    .toLowerCase()
    .replace(/\.$/, '');
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

/**
 * A forward proxy for a browser's whole egress (`--proxy-server`, with `<-loopback>` so that loopback goes
 * through it too). Playwright routes miss redirect hops of subframes, WebSockets and Chromium's own DNS
 * lookups (a name checked as public may resolve to loopback a moment later: DNS rebinding); the proxy sees
 * every connection the browser opens (plain HTTP requests, CONNECT tunnels for https:, ws: and wss:),
 * resolves the name itself and connects to the very address it judged, so what it let through cannot be
 * rebound. Origins given to `allow()` (the REAL site, a mirror on a private network) are reached by name
 * whatever they resolve to; anything else that resolves to a private, loopback or link-local address (or an
 * address literal that is one) is refused with 403.
 */
export interface EgressProxy {
  /** `http://127.0.0.1:<port>` */
  readonly url: string;
  /** Chromium arguments that send every request of the browser through this proxy. */
  readonly chromiumArgs: string[];
  /** Connections refused (private destination), as `host:port` (the last 1,000). */
  readonly refused: string[];
  /** Let `origin` through whatever it resolves to; the returned function takes the permission back. */
  allow(origin: string): () => void;
  close(): Promise<void>;
}

export interface EgressProxyOptions {
  /** Name lookup (tests: a resolver that answers what a rebinding DNS server would). */
  resolve?: (host: string) => Promise<string[]>;
  /** Origins allowed from the start. */
  allow?: string[];
}

function hostPortOf(origin: string): string | undefined {
  try {
    const u = new URL(origin);
    const port = u.port || (u.protocol === 'https:' || u.protocol === 'wss:' ? '443' : '80');
    return `${u.hostname.replace(/^\[|\]$/g, '').toLowerCase()}:${port}`;
  } catch {
    return undefined;
  }
}

export async function startEgressProxy(opts: EgressProxyOptions = {}): Promise<EgressProxy> {
  const { createServer, request: httpRequest } = await import('node:http');
  const { connect } = await import('node:net');
  const resolve = opts.resolve ?? resolveAll;
  const allowed = new Map<string, number>();
  const refused: string[] = [];
  const sockets = new Set<import('node:net').Socket>();
  const allow = (origin: string): (() => void) => {
    const key = hostPortOf(origin);
    if (!key) return () => undefined;
    allowed.set(key, (allowed.get(key) ?? 0) + 1);
    let done = false;
    return () => {
      if (done) return;
      done = true;
      const n = (allowed.get(key) ?? 1) - 1;
      if (n <= 0) allowed.delete(key);
      else allowed.set(key, n);
    };
  };
  for (const o of opts.allow ?? []) allow(o);

  /** The address to connect to, or null when the destination is refused. */
  const vet = async (rawHost: string, port: number): Promise<string | null> => {
    const host = rawHost
      .replace(/^\[|\]$/g, '')
      .toLowerCase()
      .replace(/\.$/, '');
    if (allowed.has(`${host}:${port}`)) return host;
    let ips: string[];
    if (isIP(host)) ips = [host];
    else if (isLocalName(host)) ips = [];
    else ips = await resolve(host).catch(() => []);
    // Every answer must be public: a name that also resolves to a private address is refused as a whole.
    if (ips.length === 0 || ips.some(isPrivateAddress)) {
      if (refused.length >= 1_000) refused.shift();
      refused.push(`${host}:${port}`);
      return null;
    }
    return ips.find((ip) => isIP(ip) === 4) ?? ips[0];
  };

  const server = createServer((req, res) => {
    // A plain http: request in absolute form.
    let u: URL;
    try {
      u = new URL(req.url ?? '');
    } catch {
      res.writeHead(400).end();
      return;
    }
    if (u.protocol !== 'http:') {
      res.writeHead(400).end();
      return;
    }
    const port = Number(u.port || 80);
    void vet(u.hostname, port).then((ip) => {
      if (ip === null) {
        res.writeHead(403, { 'content-type': 'text/plain' }).end('blocked by the egress proxy');
        req.resume();
        return;
      }
      const headers = { ...req.headers };
      delete headers['proxy-connection'];
      delete headers['proxy-authorization'];
      const up = httpRequest({ host: ip, port, method: req.method, path: u.pathname + u.search, headers, setHost: false }, (r) => {
        res.writeHead(r.statusCode ?? 502, r.statusMessage, r.rawHeaders);
        r.pipe(res);
      });
      up.on('error', () => {
        if (!res.headersSent) res.writeHead(502).end();
        else res.destroy();
      });
      req.pipe(up);
    });
  });
  const tunnel = (client: import('node:net').Socket, host: string, port: number, head: Buffer, prelude?: string) => {
    sockets.add(client);
    client.on('close', () => sockets.delete(client));
    client.on('error', () => client.destroy());
    void vet(host, port).then((ip) => {
      if (ip === null) {
        client.end('HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\nconnection: close\r\n\r\n');
        return;
      }
      const up = connect(port, ip, () => {
        if (prelude === undefined) client.write('HTTP/1.1 200 Connection Established\r\n\r\n');
        else up.write(prelude);
        if (head.length) up.write(head);
        up.pipe(client);
        client.pipe(up);
      });
      sockets.add(up);
      up.on('close', () => {
        sockets.delete(up);
        client.destroy();
      });
      up.on('error', () => {
        if (prelude === undefined && !client.destroyed) client.end('HTTP/1.1 502 Bad Gateway\r\n\r\n');
        else client.destroy();
      });
      client.on('close', () => up.destroy());
    });
  };
  server.on('connect', (req, client: import('node:net').Socket, head: Buffer) => {
    const m = /^(\[[^\]]+\]|[^:]+):(\d+)$/.exec(req.url ?? '');
    if (!m) {
      client.end('HTTP/1.1 400 Bad Request\r\n\r\n');
      return;
    }
    tunnel(client, m[1], Number(m[2]), head);
  });
  server.on('upgrade', (req, client: import('node:net').Socket, head: Buffer) => {
    // A ws: handshake in absolute form (Chromium tunnels WebSockets with CONNECT, other clients may not).
    let u: URL;
    try {
      u = new URL(req.url ?? '');
    } catch {
      client.end('HTTP/1.1 400 Bad Request\r\n\r\n');
      return;
    }
    const lines = [`${req.method} ${u.pathname}${u.search} HTTP/1.1`];
    for (let i = 0; i < req.rawHeaders.length; i += 2) {
      if (/^proxy-/i.test(req.rawHeaders[i])) continue;
      lines.push(`${req.rawHeaders[i]}: ${req.rawHeaders[i + 1]}`);
    }
    tunnel(client, u.hostname, Number(u.port || 80), head, `${lines.join('\r\n')}\r\n\r\n`);
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((ok, fail) => {
    server.once('error', fail);
    server.listen(0, '127.0.0.1', () => ok());
  });
  const { port } = server.address() as import('node:net').AddressInfo;
  const url = `http://127.0.0.1:${port}`;
  return {
    url,
    // `<-loopback>`: Chromium sends loopback destinations around a proxy unless told not to.
    // WebRTC: no UDP around the proxy (ICE candidates could otherwise reach the local network).
    chromiumArgs: [`--proxy-server=${url}`, '--proxy-bypass-list=<-loopback>', '--force-webrtc-ip-handling-policy=disable_non_proxied_udp'],
    refused,
    allow,
    close: () =>
      new Promise<void>((ok) => {
        for (const s of sockets) s.destroy();
        server.close(() => ok());
      }),
  };
}
