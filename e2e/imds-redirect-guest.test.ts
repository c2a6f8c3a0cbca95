// A real guest reaching the NoCloud datasource at 169.254.169.254 through
// the node-level redirect, in network namespaces this test makes (nothing
// else is touched): a "node" namespace runs the datasource listener on the
// node's address and the nftables DNAT (RedirectKeeper, as `vmseed
// redirect` runs it); a "launcher pod" namespace has a veth to the node and
// a default route through it, and inside it the busybox guest (Debian
// kernel, QEMU TCG, no disk) is attached the way KubeVirt's masquerade
// binding attaches a VM: a tap on a bridge in the pod namespace, the guest's
// traffic NATed to the pod's address. The bridge and guest addresses are the
// guest fixture's static ones (gateway 10.0.2.2, guest 10.0.2.15) rather
// than KubeVirt's DHCP-assigned 10.0.2.1/10.0.2.2; the path is the same.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import pino from 'pino';
import { signToken } from '../src/datasource/tokens.ts';
import { execNft, RedirectKeeper } from '../src/redirect/keeper.ts';
import { bootBusyboxInPod, masqueradeBinding } from './support/masquerade.ts';
import { makePodNode, sh, startNodeDatasource, stopChild } from '../test/support/netns.ts';
import { nocloudSeed } from '../test/datasource/datasource-fixtures.ts';

test(
  'busybox guest behind a masquerade-style tap fetches its seed from 169.254.169.254 over the node redirect; a made-up token gets nothing',
  { timeout: 300_000 },
  async (t) => {
    const env = await makePodNode();
    // One hook, in order: after hooks run in registration order.
    const cleanups: Array<() => Promise<unknown>> = [];
    t.after(async () => {
      for (const c of cleanups.reverse()) await c().catch(() => {});
      await env.remove();
    });
    // Masquerade binding, as KubeVirt sets it up in the launcher pod.
    await masqueradeBinding(env);

    const key = randomBytes(32);
    const ds = await startNodeDatasource(env, key, 'uid-guest');
    cleanups.push(() => stopChild(ds));
    const keeper = new RedirectKeeper({
      spec: {
        table: 'vmseed',
        to: { host: env.nodeAddress, port: 8081 },
        podInterfaces: ['veth*'],
        metadata: { address: '169.254.169.254', port: 80 },
      },
      runner: execNft({ prefix: env.inNode([]) }),
      logger: pino({ level: 'silent' }),
      // The pod is a launcher: the only sources redirected.
      launchers: async () => [env.podAddress],
    });
    await keeper.tick('start');
    assert.equal(keeper.inPlace, true);
    cleanups.push(() => keeper.stop());

    const token = signToken(new Uint8Array(key), 'uid-guest');
    const seed = nocloudSeed('vm');
    const r = await bootBusyboxInPod(
      env.pod,
      `http://169.254.169.254/v1/${token}/`,
      ['meta-data', 'user-data', 'vendor-data', 'network-config'],
      180_000,
    );
    assert.deepEqual(JSON.parse(r.files.get('meta-data')!.toString()), seed.metaData);
    assert.deepEqual(r.files.get('user-data'), Buffer.from(seed.userData));
    assert.deepEqual(r.files.get('vendor-data'), Buffer.from(seed.vendorData!));
    assert.deepEqual(r.missing, []);
    // The DNAT counted the guest's connections (4 files).
    const listed = (await sh(env.inNode(['nft', 'list', 'table', 'ip', 'vmseed']))).stdout;
    assert.match(listed, /counter packets [1-9]\d* /);
    // The guest's connections left the pod masqueraded to the pod's address
    // (what the node-level rule and the datasource see), as with KubeVirt.
    const masq = (await sh(env.inPod(['nft', 'list', 'table', 'ip', 'kubevirt-masq']))).stdout;
    assert.match(masq, /counter packets [1-9]\d* bytes \d+ masquerade/);

    const bogus = await bootBusyboxInPod(
      env.pod,
      `http://169.254.169.254/v1/${signToken(new Uint8Array(randomBytes(32)), 'uid-guest')}/`,
      ['user-data'],
      120_000,
    );
    assert.deepEqual(bogus.missing, ['user-data']);
  },
);
