// --datasource-imds-compat: token-less answers for KubeVirt IMDS VMIs only.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ConfigError, configSummary, loadConfig } from '../../src/config/config.ts';

const local = ['--local', 'examples'];
const ds = ['--datasource-listen', '127.0.0.1:8081', '--datasource-key-file', 'keys'];

test('--datasource-imds-compat: off by default, on by flag or environment, shown in the summary', () => {
  assert.equal(loadConfig([...local, ...ds], {}, '/srv')!.datasource!.imdsCompat, undefined);
  const c = loadConfig([...local, ...ds, '--datasource-imds-compat'], {}, '/srv')!;
  assert.equal(c.datasource!.imdsCompat, true);
  assert.equal(c.datasource!.compatSourceAddress, false, 'not the every-VMI compat mode');
  assert.equal((configSummary(c) as Record<string, unknown>).datasourceImdsCompat, true);
  assert.equal(
    loadConfig([...local, ...ds], { VMSEED_DATASOURCE_IMDS_COMPAT: 'true' }, '/srv')!.datasource!.imdsCompat,
    true,
  );
});

test('--datasource-imds-compat without the datasource is a configuration error', () => {
  assert.throws(
    () => loadConfig([...local, '--datasource-imds-compat'], {}, '/srv'),
    (e: unknown) => e instanceof ConfigError && /needs --datasource-listen/.test(e.message),
  );
});
