import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { temporalSettings } from '../../host/connection';

const HALO_DEFAULTS = { address: '127.0.0.1:7233', namespace: 'default' };

function tomlFile(): { dir: string; file: string } {
  const dir = mkdtempSync(join(tmpdir(), 'halo-envconfig-'));
  writeFileSync(join(dir, 'client.pem'), 'CERT');
  writeFileSync(join(dir, 'client.key'), 'KEY');
  const file = join(dir, 'temporal.toml');
  writeFileSync(
    file,
    [
      '[profile.default]',
      'address = "temporal.internal:7233"',
      'namespace = "halo"',
      '',
      '[profile.cloud]',
      'address = "halo.acct.tmprl.cloud:7233"',
      'namespace = "halo.acct"',
      'api_key = "secret"',
      '[profile.cloud.grpc_meta]',
      'x-team = "rl"',
      '',
      '[profile.mtls]',
      'address = "mtls.example:7233"',
      '[profile.mtls.tls]',
      `client_cert_path = "${join(dir, 'client.pem')}"`,
      `client_key_path = "${join(dir, 'client.key')}"`,
      'server_name = "temporal.example"',
      '',
      '[profile.tls_only]',
      'address = "tls.example:7233"',
      '[profile.tls_only.tls]',
      'disabled = false',
      '',
    ].join('\n'),
  );
  return { dir, file };
}

test('the TOML profile of TEMPORAL_CONFIG_FILE: default profile, TEMPORAL_PROFILE, variables over it', () => {
  const { file } = tomlFile();
  const def = temporalSettings(HALO_DEFAULTS, { TEMPORAL_CONFIG_FILE: file });
  assert.deepEqual(def, { address: 'temporal.internal:7233', namespace: 'halo', apiKey: undefined, tls: undefined });

  const cloud = temporalSettings(HALO_DEFAULTS, { TEMPORAL_CONFIG_FILE: file, TEMPORAL_PROFILE: 'cloud' });
  assert.equal(cloud.address, 'halo.acct.tmprl.cloud:7233');
  assert.equal(cloud.namespace, 'halo.acct');
  assert.equal(cloud.apiKey, 'secret');
  assert.equal(cloud.tls, true, 'an API key implies TLS');
  assert.deepEqual(cloud.metadata, { 'x-team': 'rl' });

  // Variables win over the profile; a blank one is unset, so the profile's value stays.
  const over = temporalSettings(HALO_DEFAULTS, { TEMPORAL_CONFIG_FILE: file, TEMPORAL_ADDRESS: '10.0.0.5:7233', TEMPORAL_NAMESPACE: '' });
  assert.deepEqual([over.address, over.namespace], ['10.0.0.5:7233', 'halo']);

  const mtls = temporalSettings(HALO_DEFAULTS, { TEMPORAL_CONFIG_FILE: file, TEMPORAL_PROFILE: 'mtls' });
  assert.equal(mtls.namespace, 'default', 'the HALO config fills in what the profile leaves out');
  const t = mtls.tls as { clientCertPair: { crt: Uint8Array; key: Uint8Array }; serverNameOverride: string };
  assert.equal(Buffer.from(t.clientCertPair.crt).toString(), 'CERT');
  assert.equal(Buffer.from(t.clientCertPair.key).toString(), 'KEY');
  assert.equal(t.serverNameOverride, 'temporal.example');

  assert.equal(temporalSettings(HALO_DEFAULTS, { TEMPORAL_CONFIG_FILE: file, TEMPORAL_PROFILE: 'tls_only' }).tls, true);
  assert.equal(temporalSettings(HALO_DEFAULTS, { TEMPORAL_CONFIG_FILE: file, TEMPORAL_PROFILE: 'cloud', TEMPORAL_TLS: 'false' }).tls, false);
  assert.throws(() => temporalSettings(HALO_DEFAULTS, { TEMPORAL_CONFIG_FILE: file, TEMPORAL_PROFILE: 'nope' }), /Profile 'nope' not found/);
});

test('the default config file is read from the user config folder; a missing file is no error', () => {
  const { dir, file } = tomlFile();
  const xdg = join(dir, 'xdg');
  mkdirSync(join(xdg, 'temporalio'), { recursive: true });
  writeFileSync(join(xdg, 'temporalio', 'temporal.toml'), '[profile.default]\naddress = "from-xdg:7233"\n');
  assert.equal(temporalSettings(HALO_DEFAULTS, { XDG_CONFIG_HOME: xdg }).address, 'from-xdg:7233');
  assert.equal(temporalSettings(HALO_DEFAULTS, { XDG_CONFIG_HOME: join(dir, 'empty') }).address, HALO_DEFAULTS.address);
  assert.equal(temporalSettings(HALO_DEFAULTS, { TEMPORAL_CONFIG_FILE: join(dir, 'missing.toml') }).address, HALO_DEFAULTS.address);
  // TEMPORAL_CONFIG_FILE wins over the default location.
  assert.equal(temporalSettings(HALO_DEFAULTS, { XDG_CONFIG_HOME: xdg, TEMPORAL_CONFIG_FILE: file }).address, 'temporal.internal:7233');
});

test('the TEMPORAL_TLS spellings that worked before still do', () => {
  for (const v of ['1', 'true', 'TRUE', 'yes']) assert.equal(temporalSettings(HALO_DEFAULTS, { TEMPORAL_TLS: v }).tls, true, v);
  for (const v of ['0', 'false', 'no']) assert.equal(temporalSettings(HALO_DEFAULTS, { TEMPORAL_TLS: v }).tls, false, v);
  assert.equal(temporalSettings(HALO_DEFAULTS, { TEMPORAL_TLS: '' }).tls, undefined);
  assert.throws(() => temporalSettings(HALO_DEFAULTS, { TEMPORAL_TLS_CLIENT_KEY_PATH: '/k.pem' }), /must be set together/);
});
