import { test } from 'node:test';
import assert from 'node:assert/strict';
import { isPrivateAddress, reachesPrivateNetwork } from '../../env/private-network';

test('loopback, private, link-local and reserved addresses are private; public ones are not', () => {
  for (const ip of [
    '127.0.0.1',
    '127.1.2.3',
    '10.0.0.1',
    '172.16.0.1',
    '172.31.255.255',
    '192.168.1.1',
    '169.254.169.254',
    '100.64.0.1',
    '0.0.0.0',
    '224.0.0.1',
    '255.255.255.255',
    '::1',
    '::',
    'fe80::1',
    'fd00::1',
    'fc12::3',
    '::ffff:127.0.0.1',
    '::ffff:169.254.169.254',
    '::ffff:7f00:1',
    '[::1]',
    '64:ff9b::a9fe:a9fe',
    '2002:c0a8:0101::1',
  ]) {
    assert.equal(isPrivateAddress(ip), true, ip);
  }
  for (const ip of ['8.8.8.8', '1.1.1.1', '172.32.0.1', '172.15.255.255', '100.128.0.1', '169.253.1.1', '2606:4700::1111', '::ffff:8.8.8.8', 'not-an-ip']) {
    assert.equal(isPrivateAddress(ip), false, ip);
  }
});

test('URLs: address literals as they are, local names always, other names by what they resolve to', async () => {
  const dns: Record<string, string[]> = { 'public.test': ['93.184.216.34'], 'rebind.test': ['93.184.216.34', '127.0.0.1'], 'meta.test': ['169.254.169.254'] };
  const resolve = async (h: string) => {
    if (!(h in dns)) throw new Error('ENOTFOUND');
    return dns[h];
  };
  const cases: [string, boolean][] = [
    ['http://127.0.0.1:9000/x', true],
    ['http://2130706433/', true], // 127.0.0.1 written as a number: the URL parser normalises it
    ['http://0x7f.1/', true],
    ['http://[::ffff:a9fe:a9fe]/', true],
    ['http://localhost/', true],
    ['http://api.localhost./', true],
    ['http://metadata.google.internal/', true],
    ['https://public.test/a.png', false],
    ['https://rebind.test/', true],
    ['https://meta.test/', true],
    ['https://nxdomain.test/', false],
    ['data:text/plain,hi', false],
    ['blob:https://public.test/uuid', false],
    ['ws://127.0.0.1:7233/', true],
  ];
  for (const [url, expected] of cases) assert.equal(await reachesPrivateNetwork(url, resolve), expected, url);
});

test('egress proxy: vets every connection by the address it connects to, lets allowed origins through', async () => {
  const { createServer, request } = await import('node:http');
  const { startEgressProxy } = await import('../../env/private-network');
  const hits: string[] = [];
  const target = createServer((req, res) => {
    hits.push(req.url ?? '');
    res.end('ok');
  });
  await new Promise<void>((r) => target.listen(0, '127.0.0.1', r));
  const port = (target.address() as import('node:net').AddressInfo).port;
  // A rebinding name: public on the first lookup, loopback on the next ones. The proxy looks up per
  // connection and connects to what it judged, so the second connection is refused.
  let lookups = 0;
  const proxy = await startEgressProxy({ resolve: async (h) => (h === 'rebind.test' ? (++lookups === 1 ? ['93.184.216.34'] : ['127.0.0.1']) : ['127.0.0.1']) });
  const viaProxy = (url: string) =>
    new Promise<number>((ok, fail) => {
      const p = new URL(proxy.url);
      const req = request({ host: p.hostname, port: p.port, path: url, headers: { host: new URL(url).host } }, (res) => {
        res.resume();
        ok(res.statusCode ?? 0);
      });
      req.on('error', fail);
      req.end();
    });
  const connect = (hostPort: string) =>
    new Promise<number>((ok, fail) => {
      const p = new URL(proxy.url);
      const req = request({ host: p.hostname, port: p.port, method: 'CONNECT', path: hostPort });
      req.on('connect', (res, socket) => {
        socket.destroy();
        ok(res.statusCode ?? 0);
      });
      req.on('response', (res) => ok(res.statusCode ?? 0));
      req.on('error', fail);
      req.end();
    });
  try {
    assert.equal(await viaProxy(`http://127.0.0.1:${port}/a`), 403);
    assert.equal(await viaProxy(`http://localhost:${port}/b`), 403);
    assert.equal(await connect(`127.0.0.1:${port}`), 403);
    assert.equal(await connect(`[::1]:${port}`), 403);
    assert.equal(await connect(`169.254.169.254:80`), 403);
    // First lookup public (the connection would go to that address, unreachable here: anything but a hit).
    await connect(`rebind.test:${port}`).catch(() => 0);
    assert.equal(await connect(`rebind.test:${port}`), 403);
    assert.equal(lookups, 2);
    assert.deepEqual(hits, []);
    // An allowed origin is reached, by CONNECT (https:, ws:) and as a plain request, until taken back.
    const release = proxy.allow(`http://127.0.0.1:${port}`);
    assert.equal(await viaProxy(`http://127.0.0.1:${port}/c`), 200);
    assert.equal(await connect(`127.0.0.1:${port}`), 200);
    assert.deepEqual(hits, ['/c']);
    release();
    assert.equal(await viaProxy(`http://127.0.0.1:${port}/d`), 403);
    assert.ok(proxy.refused.includes(`127.0.0.1:${port}`));
  } finally {
    await proxy.close();
    target.closeAllConnections();
    await new Promise((r) => target.close(r));
  }
});
