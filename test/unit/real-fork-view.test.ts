import assert from 'node:assert/strict';
import { test } from 'node:test';
import { sameView } from '../../env/real-snapshot';

// A fork's page against its parent's: a fresh page numbers, lays out and focuses its elements anew, so only what
// the elements say counts; a counter that lives in page scripts shows in their text.
test('sameView: ids, grid positions and focus aside, the pages must read the same', () => {
  const parent = ['[41] button "Bump counter (3)" focused @(120,40)', '[42] textbox "To" value="alex@example.com" @(300,200)'].join('\n');
  const copy = ['[3] button "Bump counter (3)" @(121,40)', '[4] textbox "To" value="alex@example.com" focused @(300,201)'].join('\n');
  assert.equal(sameView(parent, copy), true);
  assert.equal(sameView(parent, copy.replace('Bump counter (3)', 'Bump counter')), false);
  assert.equal(sameView(parent, copy.split('\n')[0]!), false);
  assert.equal(sameView(parent, copy.replace('textbox', 'combobox')), false);
});
