// --namespaces: namespaced mode's flag.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ConfigError, configSummary, loadConfig } from '../../src/config/config.ts';

const cluster = (argv: string[], env: NodeJS.ProcessEnv = {}) => loadConfig(argv, { NODE_NAME: 'n1', ...env }, '/');

test('absent: cluster-wide; a list: those namespaces, each once, also from VMSEED_NAMESPACES', () => {
  assert.equal(cluster([])!.namespaces, undefined);
  const c = cluster(['--namespaces', 'team-a, team-b,team-a'])!;
  assert.deepEqual(c.namespaces, ['team-a', 'team-b']);
  assert.ok(Object.isFrozen(c.namespaces));
  assert.equal(configSummary(c).namespaces, 'team-a,team-b');
  assert.deepEqual(cluster([], { VMSEED_NAMESPACES: 'x' })!.namespaces, ['x']);
});

test('names that are not DNS-1123 labels, empty entries and too many are ConfigErrors naming the flag', () => {
  for (const bad of ['Team-A', 'a,,b', 'a_b', '-a', 'a-', 'x'.repeat(64), 'a/b', ' ', 'a,b c']) {
    assert.throws(
      () => cluster([`--namespaces=${bad}`]),
      (e: unknown) => e instanceof ConfigError && /^--namespaces: /.test(e.message),
      bad,
    );
  }
  assert.equal(cluster(['--namespaces', 'x'.repeat(63)])!.namespaces![0].length, 63);
  const many = Array.from({ length: 101 }, (_, i) => `ns${i}`).join(',');
  assert.throws(() => cluster(['--namespaces', many]), /at most 100/);
});

test('--vendor-data-from in a namespace not listed is refused; listed is fine', () => {
  assert.throws(
    () => cluster(['--namespaces', 'a,b', '--vendor-data-from', 'ops/vendor']),
    (e: unknown) =>
      e instanceof ConfigError && /--vendor-data-from: namespace 'ops' is not in --namespaces/.test(e.message),
  );
  assert.equal(
    cluster(['--namespaces', 'a,ops', '--vendor-data-from', 'ops/vendor'])!.vendorDataFrom?.namespace,
    'ops',
  );
});

test('local mode has no namespaces to watch', () => {
  assert.throws(() => loadConfig(['--local', 'dir', '--namespaces', 'a'], {}, '/'), /--namespaces needs a cluster/);
});
