// `vmseed cluster`'s flags: the webhook on by default at 0.0.0.0:8443, its
// certificate directory, the serial written by default (random tokens: the
// webhook holds no key, and refuses a key file), environment fallbacks; bad
// values are one line naming the flag and the fix.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ConfigError } from '../../../src/config/values.ts';
import { loadClusterConfig } from '../../../src/config/cluster-config.ts';

test('defaults: serials written without any key; relative paths from cwd; environment fallbacks', () => {
  assert.deepEqual(loadClusterConfig([], {}, '/'), {
    webhook: { listen: { host: '0.0.0.0', port: 8443 }, certDir: '/etc/vmseed/webhook-tls', serial: 'nocloud-net' },
    cloudInit: { schemaDir: '/usr/share/vmseed/cloud-init-schemas', release: '25.1' },
    datasource: { baseUrl: 'http://169.254.169.254/v1' },
    probeListen: { host: '0.0.0.0', port: 8080 },
    logLevel: 'info',
  });
  const on = loadClusterConfig(['--webhook-serial', 'nocloud', '--webhook-listen', '10.0.0.5:8443'], {}, '/w')!;
  assert.deepEqual(on.webhook, {
    listen: { host: '10.0.0.5', port: 8443 },
    certDir: '/etc/vmseed/webhook-tls',
    serial: 'nocloud',
  });
  const base = loadClusterConfig(['--datasource-base-url', 'http://10.0.0.1:8081/v1/'], {}, '/')!;
  assert.deepEqual(base.datasource, { baseUrl: 'http://10.0.0.1:8081/v1' });
  const gateOnly = loadClusterConfig(['--webhook-cert-dir', 'tls', '--webhook-serial', 'off'], {}, '/w')!;
  assert.equal(gateOnly.webhook.certDir, '/w/tls');
  assert.equal(gateOnly.webhook.serial, 'off');
  const env = loadClusterConfig([], { VMSEED_WEBHOOK_LISTEN: ':9443', VMSEED_LOG_LEVEL: 'debug' }, '/')!;
  assert.deepEqual(env.webhook.listen, { host: '0.0.0.0', port: 9443 });
  assert.equal(env.logLevel, 'debug');
  assert.equal(loadClusterConfig(['--help'], {}, '/'), undefined);
});

test('bad values and combinations: one line naming the flag and the fix', () => {
  const cases: Array<[string[], RegExp]> = [
    // The webhook holds no key: a key file is no flag of it.
    [['--datasource-key-file', 'k'], /Unknown option '--datasource-key-file'/],
    [['--webhook-serial', 'ds'], /^--webhook-serial: 'ds' is not one of/],
    [['--webhook-listen', 'nope'], /^--webhook-listen: 'nope' is not HOST:PORT/],
    [['--datasource-base-url', 'nope'], /^--datasource-base-url: /],
    [['--node-name', 'x'], /Unknown option '--node-name'/],
    [['--cloud-init-version', '23.1'], /^--cloud-init-version: '23\.1' is not one of/],
  ];
  for (const [args, message] of cases) {
    assert.throws(
      () => loadClusterConfig(args, {}, '/'),
      (e: Error) => e instanceof ConfigError && message.test(e.message) && !e.message.includes('\n'),
      args.join(' '),
    );
  }
});

test("--cloud-init-schemas and --cloud-init-version: the webhook's schema warnings, or off", () => {
  const c = loadClusterConfig(['--cloud-init-schemas', 'schemas', '--cloud-init-version', '22.4'], {}, '/w')!;
  assert.deepEqual(c.cloudInit, { schemaDir: '/w/schemas', release: '22.4' });
  const off = loadClusterConfig([], { VMSEED_CLOUD_INIT_VERSION: 'off' }, '/')!;
  assert.equal(off.cloudInit.release, 'off');
  assert.equal(loadClusterConfig(['--kubeconfig', 'kc'], {}, '/w')!.kubeconfig, '/w/kc');
});
