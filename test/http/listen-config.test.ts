// --status-listen and --shutdown-timeout as loadConfig reads them: the
// per-VMI pages on loopback in cluster mode, on the --listen address (one
// listener) in local mode; both shown in the config summary.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { configSummary, loadConfig, AGENT_USAGE } from '../../src/config/config.ts';

const cluster = (argv: string[] = []) => loadConfig(['--node-name', 'n1', ...argv], {}, '/')!;
const local = (argv: string[] = []) => loadConfig(['--local', 'dir', ...argv], {}, '/')!;

test('cluster mode: probes on 0.0.0.0:8080, the status pages on 127.0.0.1:8090', () => {
  const c = cluster();
  assert.deepEqual(c.listen, { host: '0.0.0.0', port: 8080 });
  assert.deepEqual(c.statusListen, { host: '127.0.0.1', port: 8090 });
  assert.deepEqual(
    cluster(['--status-listen', '0.0.0.0:8080']).statusListen,
    c.listen,
    'the same address: one listener',
  );
  assert.deepEqual(loadConfig(['--node-name', 'n1'], { VMSEED_STATUS_LISTEN: '[::1]:9000' }, '/')!.statusListen, {
    host: '::1',
    port: 9000,
  });
});

test('local mode: --status-listen follows --listen unless set', () => {
  assert.deepEqual(local().statusListen, { host: '127.0.0.1', port: 8080 });
  assert.deepEqual(local(['--listen', '127.0.0.1:0']).statusListen, { host: '127.0.0.1', port: 0 });
  assert.deepEqual(local(['--listen', '127.0.0.1:0', '--status-listen', '127.0.0.2:0']).statusListen, {
    host: '127.0.0.2',
    port: 0,
  });
});

test('bad values are one clear error naming the flag; help and summary list both flags', () => {
  assert.throws(() => cluster(['--status-listen', 'nope']), /--status-listen: 'nope' is not HOST:PORT/);
  assert.throws(() => cluster(['--shutdown-timeout', 'soon']), /--shutdown-timeout: 'soon' is not a duration/);
  assert.equal(cluster().shutdownTimeoutMs, 20_000);
  assert.equal(cluster(['--shutdown-timeout', '5s']).shutdownTimeoutMs, 5000);
  assert.match(AGENT_USAGE, /--status-listen HOST:PORT/);
  assert.match(AGENT_USAGE, /--shutdown-timeout DURATION/);
  const summary = configSummary(cluster(['--shutdown-timeout', '5s']));
  assert.equal(summary.statusListen, '127.0.0.1:8090');
  assert.equal(summary.listen, '0.0.0.0:8080');
  assert.equal(summary.shutdownTimeoutSeconds, 5);
});
