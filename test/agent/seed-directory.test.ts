// The agent's SeedDirectory: seeds by UID, dropped with the image, the
// revision the datasource's token index keys on, compat-mode address lookup
// (ambiguity answers nothing), and fetches routed to the status store.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { AgentSeedDirectory, reportedAddresses } from '../../src/datasource/directory.ts';
import { StatusStore } from '../../src/agent/status-store.ts';
import { renderStatusPage, renderVmiPage, statusJson } from '../../src/http/status-page.ts';
import type { VmiObject } from '../../src/api/objects.ts';
import type { Seed } from '../../src/cloudinit/seed.ts';

const seed = (n: string): Seed => ({
  datasource: 'nocloud',
  metaData: { 'instance-id': n },
  userData: new TextEncoder().encode(`#cloud-config\nhostname: ${n}\n`),
  warnings: [],
});
const vmiOf = (
  name: string,
  uid: string,
  ifaces: Array<{ ipAddress?: string; ipAddresses?: string[] }> = [],
): VmiObject => ({
  apiVersion: 'kubevirt.io/v1',
  kind: 'VirtualMachineInstance',
  metadata: { name, namespace: 'ns', uid },
  spec: { domain: {} },
  status: { interfaces: ifaces },
});

test('put/drop by key, revision moves when the set of UIDs changes, a new object of the same name replaces the old', () => {
  const fetches: string[] = [];
  const d = new AgentSeedDirectory({ onFetch: (key, uid, file) => fetches.push(`${key} ${uid} ${file}`) });
  const r0 = d.revision;
  d.put('ns/a', vmiOf('a', 'u1'), seed('a'));
  assert.notEqual(d.revision, r0);
  const r1 = d.revision;
  d.put('ns/a', vmiOf('a', 'u1'), seed('a2'));
  assert.equal(d.revision, r1, 'same UID, new seed: no index rebuild needed');
  assert.deepEqual(d.get('u1')?.seed.metaData, { 'instance-id': 'a2' });
  d.put('ns/a', vmiOf('a', 'u2'), seed('a3'));
  assert.equal(d.get('u1'), undefined, 'the old object of the name is gone');
  assert.deepEqual([...d.listUids()], ['u2']);
  d.recordFetch('ns', 'a', 'user-data', new Date(0));
  d.recordFetch('ns', 'zzz', 'user-data', new Date(0));
  assert.deepEqual(fetches, ['ns/a u2 user-data']);
  const r2 = d.revision;
  d.drop('ns/a');
  assert.notEqual(d.revision, r2);
  assert.equal(d.get('u2'), undefined);
  assert.equal(d.size, 0);
  d.drop('ns/a');
});

test('byAddress: reported addresses (ipAddress, ipAddresses, IPv6 lower-cased, prefix/zone stripped); shared → nothing', () => {
  assert.deepEqual(
    reportedAddresses(
      vmiOf('x', 'u', [{ ipAddress: '10.0.0.5', ipAddresses: ['10.0.0.5', 'FD00::5/64', 'fe80::1%eth0'] }]),
    ),
    ['10.0.0.5', 'fd00::5', 'fe80::1'],
  );
  const d = new AgentSeedDirectory({ onFetch: () => {} });
  d.put('ns/a', vmiOf('a', 'ua', [{ ipAddress: '10.0.0.5' }]), seed('a'));
  d.put('ns/b', vmiOf('b', 'ub', [{ ipAddresses: ['10.0.0.6', 'fd00::6'] }]), seed('b'));
  assert.equal(d.byAddress('10.0.0.5')?.uid, 'ua');
  assert.equal(d.byAddress('fd00::6')?.uid, 'ub');
  assert.equal(d.byAddress('10.0.0.7'), undefined);
  d.put('ns/c', vmiOf('c', 'uc', [{ ipAddress: '10.0.0.5' }]), seed('c'));
  assert.equal(d.byAddress('10.0.0.5'), undefined, 'two VMIs report it: ambiguous');
});

test('status: ready NoCloud VMIs are marked served (never their serial), fetches land on the record, both on the pages', () => {
  const now = new Date('2026-11-22T03:00:00Z');
  const s = new StatusStore({
    version: 't',
    nodeName: 'n',
    stateDir: '/tmp',
    config: {},
    watch: () => ({ mode: 'local', synced: true, connected: true, stale: false, restarts: 0 }),
    queue: () => ({ depth: 0, inFlight: 0 }),
    servedOverHttp: true,
    now: () => now,
  });
  s.update('ns/a', 'ua', { state: 'ready', datasource: 'nocloud' });
  s.update('ns/cd', 'ucd', { state: 'ready', datasource: 'configdrive' });
  s.update('ns/p', 'up', {});
  s.recordFetch('ns/a', 'ua', 'user-data', new Date(now.getTime() - 5000));
  s.recordFetch('ns/a', 'other-uid', 'meta-data', now);
  const json = statusJson(s.snapshot(), undefined, now);
  const by = Object.fromEntries(json.vmis.map((v) => [v.name, v]));
  assert.equal(by.a.servedOverHttp, true);
  assert.ok(!JSON.stringify(json).includes('ds=nocloud'), 'no serial in /status.json');
  assert.deepEqual(by.a.lastFetch, { 'user-data': '2026-11-22T02:59:55.000Z' });
  assert.equal(by.cd.servedOverHttp, undefined, 'ConfigDrive is not served over HTTP');
  assert.equal(by.p.servedOverHttp, undefined, 'no image yet');
  assert.equal(s.get('ns/a')!.servedOverHttp, undefined, 'computed at snapshot time, not stored');
  const page = renderStatusPage(s.snapshot(), { now });
  assert.match(page, /the guest fetched user-data 5s ago/);
  const detail = renderVmiPage(
    s.snapshot(),
    s.snapshot().vmis.find((v) => v.name === 'a')!,
    { now },
  );
  assert.ok(detail.includes('vmseed seed-url ns/a --uid ua --key-file KEYFILE'));
  assert.ok(!detail.includes('ds=nocloud'));
  assert.match(detail, /the guest fetched user-data at /);
});
