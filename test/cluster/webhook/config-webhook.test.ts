// The webhook's flags: off unless --webhook-listen is given; its other flags
// need it; the serial needs the datasource it points at.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ConfigError, configSummary, loadConfig } from '../../../src/config/config.ts';

const cluster = ['--node-name', 'node-a'];
const datasource = ['--datasource-listen', '127.0.0.1:8081', '--datasource-key-file', '/k/keys'];

test('off by default; on with --webhook-listen, its certificate directory and the serial defaulted from the datasource', () => {
  assert.equal(loadConfig(cluster, {}, '/')!.webhook, undefined);
  const on = loadConfig([...cluster, ...datasource, '--webhook-listen', ':8443'], {}, '/')!;
  assert.deepEqual(on.webhook, {
    listen: { host: '0.0.0.0', port: 8443 },
    certDir: '/etc/vmseed/webhook-tls',
    serial: 'nocloud-net',
  });
  assert.equal(configSummary(on).webhookSerial, 'nocloud-net');
  const gateOnly = loadConfig(
    [...cluster, '--webhook-listen', '127.0.0.1:9443', '--webhook-cert-dir', 'tls'],
    {},
    '/w',
  );
  assert.deepEqual(gateOnly!.webhook, { listen: { host: '127.0.0.1', port: 9443 }, certDir: '/w/tls', serial: 'off' });
  const env = loadConfig(cluster, { VMSEED_WEBHOOK_LISTEN: ':8443', VMSEED_WEBHOOK_SERIAL: 'off' }, '/')!;
  assert.equal(env.webhook?.serial, 'off');
});

test('flags that need another: one line naming the flag and the fix', () => {
  const cases: Array<[string[], RegExp]> = [
    [['--webhook-cert-dir', '/x'], /^--webhook-cert-dir needs --webhook-listen HOST:PORT/],
    [['--webhook-serial', 'nocloud'], /^--webhook-serial needs --webhook-listen HOST:PORT/],
    [
      ['--webhook-listen', ':8443', '--webhook-serial', 'nocloud'],
      /^--webhook-serial nocloud needs --datasource-listen/,
    ],
    [['--webhook-listen', ':8443', '--webhook-serial', 'ds'], /^--webhook-serial/],
    [['--webhook-listen', 'nope'], /^--webhook-listen: 'nope' is not HOST:PORT/],
  ];
  for (const [args, message] of cases) {
    assert.throws(
      () => loadConfig([...cluster, ...args], {}, '/'),
      (e: Error) => e instanceof ConfigError && message.test(e.message) && !e.message.includes('\n'),
      args.join(' '),
    );
  }
});
