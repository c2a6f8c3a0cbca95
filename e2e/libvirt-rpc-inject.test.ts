// The injector and the agent on the RPC client (`--libvirt rpc`) when
// libvirt misbehaves or is busy: a private libvirtd killed and restarted
// in the middle of 100 injections and 100 ejections, and under an agent
// whose VMIs wait for their domains; a domain undefined (and destroyed)
// while its attach is in flight; 50 domains started paused and seeded at
// once through one connection. Real libvirtd + QEMU (TCG).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { LibvirtInjector } from '../src/libvirt/injector.ts';
import { RpcLibvirtClient } from '../src/libvirt/rpc/rpc-client.ts';
import type { DeviceFlags } from '../src/libvirt/libvirt-client.ts';
import { parseDomainXml, SEED_ALIAS } from '../src/libvirt/disk-xml.ts';
import { VmseedError } from '../src/errors.ts';
import type { InjectionTarget } from '../src/libvirt/injector-contract.ts';
import {
  ensureLibvirtd,
  uniqueName,
  destroyDomain,
  emptyDomainXml,
  defineDomain,
  domblklist,
  virsh,
  LIBVIRT_URI,
} from './support/libvirtd.ts';
import { startPrivateLibvirtd, type PrivateLibvirtd } from './support/private-libvirtd.ts';
import { cleanupAll, startAgentProcess, vmiYaml, waitUntil } from './support/agent-process.ts';
import { parseTemplate } from '../src/libvirt/template.ts';

let dir: string;
let daemon: PrivateLibvirtd;
const systemDomains: string[] = [];

before(async () => {
  await ensureLibvirtd();
  daemon = await startPrivateLibvirtd();
  dir = mkdtempSync(join(tmpdir(), 'vmseed-e2e-rpc-inject-'));
});

after(async () => {
  for (const d of systemDomains) await destroyDomain(d);
  await daemon.stop();
  rmSync(dir, { recursive: true, force: true });
});

function seedFile(label: string): string {
  const p = join(dir, `${label}.iso`);
  writeFileSync(p, Buffer.alloc(64 * 1024, label));
  return p;
}

const target = (name: string, annotations: Record<string, string> = {}): InjectionTarget => ({
  namespace: 'e2e',
  name,
  uid: `uid-${name}`,
  datasource: 'nocloud',
  annotations,
});

// How long a retryable error is retried for: the restarted libvirtd may take
// seconds to answer again on a loaded machine, and the reconciler never gives
// up on a retryable error.
const RETRY_FOR_MS = 90_000;

// Retried as the reconciler does: a retryable error, then the next pass.
async function injectRetrying(
  inj: LibvirtInjector,
  t: InjectionTarget,
  image: string,
  errors: Map<string, number>,
): Promise<string> {
  for (const end = Date.now() + RETRY_FOR_MS; ;) {
    try {
      return (await inj.inject(t, image)).action;
    } catch (e) {
      if (!(e instanceof VmseedError) || e.kind !== 'retryable' || Date.now() > end) throw e;
      errors.set(e.code, (errors.get(e.code) ?? 0) + 1);
      await sleep(50);
    }
  }
}

async function seedDisks(client: RpcLibvirtClient, uri: string, domain: string, inactive: boolean): Promise<number> {
  return parseDomainXml(await client.domainXml(uri, domain, { inactive })).disks.filter((d) => d.alias === SEED_ALIAS)
    .length;
}

test(
  'libvirtd killed and restarted in the middle of 100 injections, then of 100 ejections: every one completes, each disk attached once, all removed',
  { timeout: 240_000 },
  async (t) => {
    const names = Array.from({ length: 100 }, (_, i) => uniqueName(`rs${i}`));
    for (const n of names) await daemon.define(emptyDomainXml({ name: `e2e_${n}`, scsiController: true }));
    const client = new RpcLibvirtClient({ timeoutMs: 30_000, backoffInitialMs: 20, backoffMaxMs: 500 });
    t.after(() => client.close());
    const inj = new LibvirtInjector({ client, uriTemplate: parseTemplate('uri', daemon.uri), bus: 'scsi' });
    const seed = seedFile('restart');
    const errors = new Map<string, number>();
    const actions: string[] = [];
    let done = 0;
    const all = Promise.all(
      names.map(async (n, i) => {
        await sleep(i * 10);
        actions.push(await injectRetrying(inj, target(n), seed, errors));
        done++;
      }),
    );
    await sleep(400);
    const before = done;
    await daemon.restart({ downMs: 300 });
    await all;
    t.diagnostic(`injections done before the kill: ${before}; retried: ${JSON.stringify([...errors])}`);
    assert.ok(before < 100, 'the restart came while injections were running');
    // An attach that landed before the kill is seen by the retry's read
    // ('none'), never made twice (libvirt would refuse it: TARGET_IN_USE).
    assert.equal(actions.length, 100);
    assert.ok(
      actions.every((a) => a === 'attached' || a === 'none'),
      actions.join(','),
    );
    for (const code of errors.keys())
      assert.ok(
        ['LIBVIRT_CONNECTION_LOST', 'LIBVIRT_UNREACHABLE', 'LIBVIRT_TIMEOUT'].includes(code),
        `unexpected ${code}`,
      );
    const counts = await Promise.all(names.map((n) => seedDisks(client, daemon.uri, `e2e_${n}`, true)));
    assert.deepEqual(
      counts,
      names.map(() => 1),
    );

    // The same across a restart for the ejections (config-only disks).
    let ejected = 0;
    const ejectErrors = new Map<string, number>();
    const ejections = Promise.all(
      names.map(async (n, i) => {
        await sleep(i * 10);
        for (const end = Date.now() + RETRY_FOR_MS; ;) {
          try {
            await inj.eject(target(n));
            break;
          } catch (e) {
            if (!(e instanceof VmseedError) || e.kind !== 'retryable' || Date.now() > end) throw e;
            ejectErrors.set(e.code, (ejectErrors.get(e.code) ?? 0) + 1);
            await sleep(50);
          }
        }
        ejected++;
      }),
    );
    await sleep(400);
    const ejectedBefore = ejected;
    await daemon.restart({ downMs: 300 });
    await ejections;
    t.diagnostic(`ejections done before the kill: ${ejectedBefore}; retried: ${JSON.stringify([...ejectErrors])}`);
    assert.ok(ejectedBefore < 100);
    const left = await Promise.all(names.map((n) => seedDisks(client, daemon.uri, `e2e_${n}`, true)));
    assert.deepEqual(
      left,
      names.map(() => 0),
    );
  },
);

test(
  'agent (--libvirt rpc): VMIs waiting for their domains across a libvirtd restart are seeded when the domains appear after it',
  { timeout: 180_000 },
  async (t) => {
    const agent = await startAgentProcess(['--libvirt', 'rpc', '--libvirt-uri', daemon.uri, '--disk-bus', 'scsi']);
    t.after(() => cleanupAll(() => agent.dispose()));
    const names = Array.from({ length: 5 }, (_, i) => uniqueName(`aw${i}`));
    for (const n of names)
      await agent.put(
        `${n}.yaml`,
        vmiYaml({ namespace: 'e2e', name: n, cloudInit: JSON.stringify({ userData: `#cloud-config\n# ${n}\n` }) }),
      );
    await waitUntil(
      'every VMI waiting for its domain',
      async () =>
        (await Promise.all(names.map((n) => agent.vmi('e2e', n)))).every(
          (r) => r?.lastError?.code === 'DOMAIN_NOT_FOUND',
        ),
      60_000,
      () => agent.log().slice(-3000),
    );
    await daemon.restart({ downMs: 300 });
    // Defined after the restart, on the new daemon: seen through the
    // re-established watch (events), or at worst the retry backoff.
    for (const n of names) await daemon.define(emptyDomainXml({ name: `e2e_${n}`, scsiController: true }));
    const client = new RpcLibvirtClient();
    t.after(() => client.close());
    await waitUntil(
      'every VMI seeded',
      async () =>
        (await Promise.all(names.map((n) => agent.vmi('e2e', n)))).every((r) => r?.state === 'ready' && r.injection),
      60_000,
      () => agent.log().slice(-3000),
    );
    for (const n of names) assert.equal(await seedDisks(client, daemon.uri, `e2e_${n}`, true), 1, n);
    assert.equal(await agent.stop(), 0);
  },
);

// A client that, between the injector's read and its attach, removes the
// domain: `destroy; undefine` in one virsh process, the attach sent `lagMs`
// after that process starts (about when virsh has connected), so across
// trials the removal lands before, during and after the attach.
class RemovingClient extends RpcLibvirtClient {
  lagMs = 0;
  removal: Promise<unknown> | undefined;

  override async attachDevice(uri: string, domain: string, xml: string, o: DeviceFlags): Promise<void> {
    this.removal = virsh(`destroy ${domain}; undefine ${domain}`).catch((e: unknown) => e);
    await sleep(this.lagMs);
    return super.attachDevice(uri, domain, xml, o);
  }
}

test(
  'a domain undefined (and destroyed) while its attach is in flight: the attach lands or fails with a typed retryable error, the next pass finds no domain, the connection serves on',
  { timeout: 240_000 },
  async (t) => {
    const client = new RemovingClient({ timeoutMs: 30_000 });
    t.after(() => client.close());
    const inj = new LibvirtInjector({ client, bus: 'scsi' });
    const outcomes: string[] = [];
    for (const lagMs of [0, 10, 20, 30, 40, 60]) {
      const name = uniqueName(`undef${lagMs}`);
      const domain = `e2e_${name}`;
      systemDomains.push(domain);
      await defineDomain(emptyDomainXml({ name: domain, scsiController: true }));
      await virsh('start', '--paused', domain);
      client.lagMs = lagMs;
      try {
        const r = await inj.inject(target(name), seedFile(`undef${lagMs}`));
        outcomes.push(r.action);
      } catch (e) {
        assert.ok(e instanceof VmseedError, String(e));
        assert.equal(e.kind, 'retryable', e.message);
        outcomes.push(e.code);
      }
      await client.removal;
      // The reconciler's next pass: no domain, nothing attached anywhere.
      await assert.rejects(
        inj.inject(target(name), seedFile(`undef${lagMs}`)),
        (e: unknown) => e instanceof VmseedError && e.code === 'DOMAIN_NOT_FOUND' && e.retryable,
      );
      assert.deepEqual(await inj.eject(target(name)), { action: 'none', domain });
    }
    t.diagnostic(`outcomes by lag: ${outcomes.join(', ')}`);
    assert.ok(
      outcomes.every((o) => ['attached', 'DOMAIN_NOT_FOUND', 'LIBVIRT_FAILED', 'LIBVIRT_TIMEOUT'].includes(o)),
      outcomes.join(','),
    );
    assert.match(await client.version(LIBVIRT_URI), /^\d+\.\d+\.\d+$/);
    assert.equal(client.manager.openCount, 1);
  },
);

test(
  '50 domains started paused, seeded at once through one connection (live and config), then ejected at once on device-removed events',
  { timeout: 300_000 },
  async (t) => {
    const names = Array.from({ length: 50 }, (_, i) => uniqueName(`fifty${i}`));
    for (const n of names) {
      systemDomains.push(`e2e_${n}`);
      await defineDomain(emptyDomainXml({ name: `e2e_${n}`, scsiController: true }));
      await virsh('start', '--paused', `e2e_${n}`);
    }
    const client = new RpcLibvirtClient({ timeoutMs: 120_000 });
    t.after(() => client.close());
    const inj = new LibvirtInjector({ client, bus: 'scsi' });
    const seed = seedFile('fifty');
    const results = await Promise.all(names.map((n) => inj.inject(target(n), seed)));
    assert.deepEqual(
      results.map((r) => [r.action, r.targetDev, r.flags.join(' '), r.domainState, r.resumed]),
      names.map(() => ['attached', 'sdzz', '--live --config', 'paused', false]),
    );
    assert.equal(client.manager.openCount, 1, 'one socket for all 50');
    for (const n of names) {
      assert.deepEqual(
        (await domblklist(`e2e_${n}`)).map((b) => [b.target, b.source]),
        [['sdzz', seed]],
      );
      assert.equal(await seedDisks(client, LIBVIRT_URI, `e2e_${n}`, true), 1);
    }
    const ejected = await Promise.all(names.map((n) => inj.eject(target(n))));
    assert.ok(ejected.every((r) => r.action === 'detached'));
    for (const n of names) assert.deepEqual(await domblklist(`e2e_${n}`), [], n);
    assert.equal(client.manager.openCount, 1);
  },
);

// The RPC client remembers each domain's handle (libvirtd finds a domain by
// its UUID): a name that now belongs to another domain must reach that one.
test(
  'a name redefined (new UUID) or renamed away between injections: the next injection reaches the domain that has the name now, the old one is untouched',
  { timeout: 120_000 },
  async (t) => {
    const client = new RpcLibvirtClient({ timeoutMs: 30_000 });
    t.after(() => client.close());
    const inj = new LibvirtInjector({ client, bus: 'scsi' });
    const name = uniqueName('rename');
    const domain = `e2e_${name}`;
    const moved = `${domain}_old`;
    systemDomains.push(domain, moved);
    const uuidOf = async (d: string) => (await virsh('domuuid', d)).trim();
    const configSeeds = async (d: string) => (await domblklist(d, true)).filter((r) => r.target === 'sdzz').length;

    // Renamed (only a shut-off domain can be), then a new domain of that name.
    await defineDomain(emptyDomainXml({ name: domain, scsiController: true }));
    assert.equal((await inj.inject(target(name), seedFile('rename1'))).action, 'attached');
    const first = await uuidOf(domain);
    await virsh('domrename', domain, moved);
    await defineDomain(emptyDomainXml({ name: domain, scsiController: true }));
    assert.notEqual(await uuidOf(domain), first);
    assert.equal((await inj.inject(target(name), seedFile('rename2'))).action, 'attached');
    assert.equal(await configSeeds(domain), 1, 'the new domain got its seed');
    assert.equal(await configSeeds(moved), 1, 'the renamed one kept exactly its own');
    assert.match((await domblklist(moved, true)).find((r) => r.target === 'sdzz')!.source, /rename1\.iso$/);

    // Undefined and defined again under the same name: a new UUID.
    await virsh('undefine', domain);
    await defineDomain(emptyDomainXml({ name: domain, scsiController: true }));
    await virsh('start', '--paused', domain);
    assert.equal((await inj.inject(target(name), seedFile('rename3'))).action, 'attached');
    assert.equal((await domblklist(domain)).filter((r) => r.target === 'sdzz').length, 1);
    assert.equal(client.manager.openCount, 1);
  },
);
