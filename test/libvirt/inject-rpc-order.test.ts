// On the RPC client an injection's read and the copy into the launcher's
// volume overlap: the read's requests are on the socket before the copy's
// synchronous file calls start, so libvirt answers while they run.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Socket } from 'node:net';
import { LibvirtInjector } from '../../src/libvirt/injector.ts';
import { RpcLibvirtClient } from '../../src/libvirt/rpc/rpc-client.ts';
import { DomainLock } from '../../src/libvirt/domain-lock.ts';
import type { ImagePublisher } from '../../src/libvirt/publish.ts';
import type { InjectionTarget } from '../../src/libvirt/injector-contract.ts';
import { handshakeDaemon, reply } from '../support/fake-rpc-daemon.ts';
import { Encoder, PROC } from '../support/libvirt-wire.ts';

const UUID = Buffer.alloc(16, 0xb7);
const XML =
  "<domain type='qemu'><name>ns1_vm1</name><devices><controller type='scsi' index='0' model='virtio-scsi'/></devices></domain>";

test("RPC: the read's requests are written before the copy into the launcher's volume starts", async (t) => {
  const fake = await handshakeDaemon([0], (p, sock) => {
    switch (p.header.proc) {
      case PROC.DOMAIN_LOOKUP_BY_NAME:
        reply(sock, p, new Encoder().domain({ name: 'ns1_vm1', uuid: UUID, id: 1 }).bytes());
        return true;
      case PROC.DOMAIN_GET_STATE:
        reply(sock, p, new Encoder().int(3).int(0).bytes());
        return true;
      case PROC.DOMAIN_IS_PERSISTENT:
        reply(sock, p, new Encoder().int(0).bytes());
        return true;
      case PROC.DOMAIN_GET_XML_DESC:
        reply(sock, p, new Encoder().string(XML).bytes());
        return true;
      case PROC.DOMAIN_ATTACH_DEVICE_FLAGS:
        reply(sock, p, Buffer.alloc(0));
        return true;
    }
    return false;
  });
  // Wired as the agent wires them: one per-domain lock, so the attach runs
  // in the injection's turn (a second lock of the same domain would never
  // be free while the injection holds the first).
  const lock = new DomainLock();
  const client = new RpcLibvirtClient({ resolve: (uri) => ({ socketPath: fake.path, name: uri }), lock });
  t.after(async () => {
    await client.close();
    await fake.close();
  });
  const steps: string[] = [];
  const publisher: ImagePublisher = {
    publish: async () => {
      steps.push('copy');
      return '/var/run/kubevirt-ephemeral-disks/vmseed/vmseed-nocloud.iso';
    },
    unpublish: async () => {},
  };
  const inj = new LibvirtInjector({ client, publisher, bus: 'scsi', liveOnly: true, lock });
  const target: InjectionTarget = { namespace: 'ns1', name: 'vm1', uid: 'u', datasource: 'nocloud', annotations: {} };
  // Connected, the domain's handle known: an injection is the read and the attach.
  await client.domainInfo('qemu:///system', 'ns1_vm1');

  // Writes on the client's side of the socket (the daemon's sockets belong to a server).
  const write = Socket.prototype.write;
  Socket.prototype.write = function (this: Socket & { server?: unknown }, ...args: unknown[]) {
    if (!this.server) steps.push('request');
    return (write as (...a: unknown[]) => boolean).apply(this, args);
  };
  try {
    const r = await inj.inject(target, '/seeds/nocloud.iso');
    assert.equal(r.action, 'attached');
  } finally {
    Socket.prototype.write = write;
  }
  const copy = steps.indexOf('copy');
  assert.ok(copy > 0, `the copy after the read's requests: ${steps.join(', ')}`);
  assert.deepEqual(steps.slice(0, copy), Array(copy).fill('request'));
  assert.equal(steps.slice(copy + 1).filter((s) => s === 'request').length, 1, 'then one request: the attach');
  await lock.idle();
  assert.equal(lock.size, 0, 'the domain is let go once the injection is over');
});
