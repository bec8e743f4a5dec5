import { test } from 'node:test';
import assert from 'node:assert/strict';
import { isPrivateAddress, reachesPrivateNetwork } from '../../env/private-network';

test('loopback, private, link-local and reserved addresses are private; public ones are not', () => {
  for (const ip of ['127.0.0.1', '127.1.2.3', '10.0.0.1', '172.16.0.1', '172.31.255.255', '192.168.1.1', '169.254.169.254', '100.64.0.1', '0.0.0.0', '224.0.0.1', '255.255.255.255', '::1', '::', 'fe80::1', 'fd00::1', 'fc12::3', '::ffff:127.0.0.1', '::ffff:169.254.169.254', '::ffff:7f00:1', '[::1]', '64:ff9b::a9fe:a9fe', '2002:c0a8:0101::1']) {
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
