// The virsh LibvirtClient's command lines and parsing, with a fake spawner
// (e2e/libvirt-rpc.test.ts runs it against real libvirtd).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { VirshLibvirtClient, parseVirshDominfo } from '../../src/libvirt/virsh/virsh-client.ts';
import { VmseedError } from '../../src/errors.ts';
import type { ProcessSpawner, SpawnResult } from '../../src/libvirt/virsh/runner.ts';

function recorder(stdout = '') {
  const calls: Array<{ args: string[]; xml?: string }> = [];
  const spawner: ProcessSpawner = {
    holdSocket: () => assert.fail('qemu:///system names no socket to hold'),
    async run(_file, args): Promise<SpawnResult> {
      const a = [...args];
      const i = a.indexOf('--file');
      calls.push({ args: a, ...(i >= 0 ? { xml: readFileSync(a[i + 1], 'utf8') } : {}) });
      return { exitCode: 0, signal: null, stdout, stderr: '', timedOut: false, outputTruncated: false };
    },
  };
  return { calls, spawner };
}

test('domain names go after --domain, so one starting with - stays a name; XML goes through a file', async () => {
  const r = recorder();
  const c = new VirshLibvirtClient({ spawner: r.spawner });
  await c.domainXml('qemu:///system', '--help', { inactive: true });
  await c.attachDevice('qemu:///system', '-x', '<disk/>', { live: true, config: false });
  await c.detachDevice('qemu:///system', 'd', '<disk/>', { live: true, config: true });
  await c.resume('qemu:///system', 'd');
  assert.deepEqual(r.calls[0].args, ['-q', '-c', 'qemu:///system', 'dumpxml', '--inactive', '--domain', '--help']);
  assert.deepEqual(r.calls[1].args.slice(0, 7), [
    '-q',
    '-c',
    'qemu:///system',
    'attach-device',
    '--domain',
    '-x',
    '--file',
  ]);
  assert.deepEqual(r.calls[1].args.slice(8), ['--live']);
  assert.equal(r.calls[1].xml, '<disk/>');
  assert.deepEqual(r.calls[2].args.slice(8), ['--live', '--config']);
  assert.deepEqual(r.calls[3].args, ['-q', '-c', 'qemu:///system', 'resume', '--domain', 'd']);
});

test('dominfo: virsh state words to libvirt state names', () => {
  const info = (state: string, persistent = 'yes') =>
    parseVirshDominfo(
      `Id:             3\nName:           d\nState:          ${state}\nPersistent:     ${persistent}\n`,
    );
  assert.deepEqual(info('running'), { state: 'running', rawState: 'running', persistent: true });
  assert.deepEqual(info('idle'), { state: 'running', rawState: 'blocked', persistent: true });
  assert.deepEqual(info('paused', 'no'), { state: 'paused', rawState: 'paused', persistent: false });
  assert.deepEqual(info('shut off'), { state: 'shutoff', rawState: 'shutoff', persistent: true });
  assert.deepEqual(info('in shutdown'), { state: 'other', rawState: 'shutdown', persistent: true });
  assert.throws(() => parseVirshDominfo('nothing'), /no State\/Persistent/);
  assert.deepEqual(parseVirshDominfo('State:          shut off\nPersistent:     no\n'), {
    state: 'shutoff',
    rawState: 'shutoff',
    persistent: false,
  });
  assert.deepEqual(parseVirshDominfo('State:          pmsuspended\nPersistent:     yes\n'), {
    state: 'other',
    rawState: 'pmsuspended',
    persistent: true,
  });
  assert.throws(
    () => parseVirshDominfo('garbage'),
    (e: unknown) => e instanceof VmseedError && e.code === 'VIRSH_FAILED',
  );
});

test('version: the daemon line wins over the library line', async () => {
  const both = recorder(
    'Compiled against library: libvirt 9.0.0\nUsing library: libvirt 9.0.0\nRunning against daemon: 10.1.0\n',
  );
  assert.equal(await new VirshLibvirtClient({ spawner: both.spawner }).version('qemu:///system'), '10.1.0');
  const lib = recorder('Compiled against library: libvirt 8.0.0\nUsing library: libvirt 9.0.0\n');
  assert.equal(await new VirshLibvirtClient({ spawner: lib.spawner }).version('qemu:///system'), '9.0.0');
});
