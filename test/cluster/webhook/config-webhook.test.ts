// `vmseed cluster`'s flags: the webhook on by default at 0.0.0.0:8443, its
// certificate directory, the serial defaulted from the datasource key file
// it signs with, environment fallbacks; bad values are one line naming the
// flag and the fix.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ConfigError } from '../../../src/config/values.ts';
import { loadClusterConfig } from '../../../src/config/cluster-config.ts';

test('defaults; the serial defaulted from the key file; relative paths from cwd; environment fallbacks', () => {
  assert.deepEqual(loadClusterConfig([], {}, '/'), {
    webhook: { listen: { host: '0.0.0.0', port: 8443 }, certDir: '/etc/vmseed/webhook-tls', serial: 'off' },
    probeListen: { host: '0.0.0.0', port: 8080 },
    logLevel: 'info',
  });
  const on = loadClusterConfig(['--datasource-key-file', 'k/keys', '--webhook-listen', '10.0.0.5:8443'], {}, '/w')!;
  assert.deepEqual(on.webhook, {
    listen: { host: '10.0.0.5', port: 8443 },
    certDir: '/etc/vmseed/webhook-tls',
    serial: 'nocloud-net',
  });
  assert.deepEqual(on.datasource, { keyFile: '/w/k/keys', baseUrl: 'http://169.254.169.254/v1' });
  const gateOnly = loadClusterConfig(['--webhook-cert-dir', 'tls', '--webhook-serial', 'off'], {}, '/w')!;
  assert.equal(gateOnly.webhook.certDir, '/w/tls');
  assert.equal(gateOnly.datasource, undefined);
  const env = loadClusterConfig([], { VMSEED_WEBHOOK_LISTEN: ':9443', VMSEED_LOG_LEVEL: 'debug' }, '/')!;
  assert.deepEqual(env.webhook.listen, { host: '0.0.0.0', port: 9443 });
  assert.equal(env.logLevel, 'debug');
  assert.equal(loadClusterConfig(['--help'], {}, '/'), undefined);
});

test('bad values and combinations: one line naming the flag and the fix', () => {
  const cases: Array<[string[], RegExp]> = [
    [['--webhook-serial', 'nocloud'], /^--webhook-serial nocloud needs --datasource-key-file FILE/],
    [['--webhook-serial', 'ds'], /^--webhook-serial: 'ds' is not one of/],
    [['--webhook-listen', 'nope'], /^--webhook-listen: 'nope' is not HOST:PORT/],
    [['--datasource-key-file', 'k', '--datasource-base-url', 'nope'], /^--datasource-base-url: /],
    [['--node-name', 'x'], /Unknown option '--node-name'/],
  ];
  for (const [args, message] of cases) {
    assert.throws(
      () => loadClusterConfig(args, {}, '/'),
      (e: Error) => e instanceof ConfigError && message.test(e.message) && !e.message.includes('\n'),
      args.join(' '),
    );
  }
});
