import { test } from 'node:test';
import assert from 'node:assert/strict';
import { isHarnessPath, normalisedPath } from '../../env/real-paths';

test('the REAL harness endpoints are recognised however the path spells them', () => {
  const blocked = [
    '/finish',
    '/finish/',
    '/config',
    '/submit',
    '/%66inish',
    '/%66%69%6e%69%73%68',
    '/FINISH',
    '/Finish/',
    '/%46INISH',
    '//finish',
    '/finish//',
    '/./finish',
    '/a/../finish',
    '/a/%2e%2e/finish',
    '/a/%2E%2E/config',
    '/%2566inish',
    '/%252566inish',
    '\\finish',
    '/finish;x=1',
    '/%2ffinish',
    '/ finish',
  ];
  for (const p of blocked) assert.equal(isHarnessPath(p), true, `${p} (as ${normalisedPath(p)}) should be blocked`);
  const allowed = ['/', '/inbox', '/finished', '/finish/now', '/configure', '/a/finish', '/%zzfinish', '/%', '/search?q=finish'];
  for (const p of allowed) assert.equal(isHarnessPath(p), false, `${p} (as ${normalisedPath(p)}) should be allowed`);
});

test('normalisedPath: decoded, lower case, no dot segments, single slashes', () => {
  assert.equal(normalisedPath('/A//B/./c/../D/'), '/a/b/d');
  assert.equal(normalisedPath(''), '/');
  assert.equal(normalisedPath('/../../etc'), '/etc');
});
