// blockStats on both clients: the RPC call's wire layout (libvirt's
// remote_domain_block_stats_args/_ret) against a scripted daemon, its
// bounds (a reply of another size, a counter below -1), and virsh
// domblkstat's output as libvirt prints it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RpcLibvirtClient } from '../../src/libvirt/rpc/rpc-client.ts';
import { parseVirshBlockStats } from '../../src/libvirt/virsh/virsh-client.ts';
import { RemoteSession } from '../../src/libvirt/rpc/remote.ts';
import { now } from '../../src/libvirt/rpc/rpc-connection.ts';
import { VmseedError } from '../../src/errors.ts';
import { handshakeDaemon, reply } from '../support/fake-rpc-daemon.ts';
import { Decoder, Encoder, PROC } from '../support/libvirt-wire.ts';

const DOM = { name: 'ns_vm', uuid: Buffer.alloc(16, 7), id: 3 };

// A daemon that finds DOM and answers block stats with `stats` (hypers as
// written) and records the target it was asked for.
async function statsDaemon(stats: bigint[]) {
  const asked: string[] = [];
  const fake = await handshakeDaemon([0], (p, sock) => {
    if (p.header.proc === PROC.DOMAIN_LOOKUP_BY_NAME) {
      reply(sock, p, new Encoder().domain(DOM).bytes());
      return true;
    }
    // remote_domain_block_stats_args { remote_nonnull_domain dom; remote_nonnull_string path; }
    if (p.header.proc !== PROC.DOMAIN_BLOCK_STATS) return false;
    const d = new Decoder(p.payload);
    assert.equal(d.domain().name, DOM.name);
    asked.push(d.string());
    d.done('block-stats args');
    // remote_domain_block_stats_ret: five hypers.
    const w = new Encoder();
    for (const v of stats) w.hyper(v);
    reply(sock, p, w.bytes());
    return true;
  });
  const client = new RpcLibvirtClient({ resolve: (uri) => ({ socketPath: fake.path, name: uri }), timeoutMs: 5_000 });
  return {
    asked,
    client,
    path: fake.path,
    async close() {
      await client.close();
      await fake.close();
    },
  };
}

test('rpc blockStats: procedure 64 with the domain and the target dev; five counters, -1 kept as -1', async () => {
  const d = await statsDaemon([12n, 49152n, 0n, 0n, -1n]);
  try {
    assert.deepEqual(await d.client.blockStats('qemu:///fake', DOM.name, 'sdzz'), {
      rdReq: 12,
      rdBytes: 49152,
      wrReq: 0,
      wrBytes: 0,
      errs: -1,
    });
    assert.deepEqual(d.asked, ['sdzz']);
  } finally {
    await d.close();
  }
});

for (const [what, stats] of [
  ['a sixth counter (trailing bytes)', [1n, 2n, 3n, 4n, 5n, 6n]],
  ['four counters (short reply)', [1n, 2n, 3n, 4n]],
  ['a counter below -1', [-5n, 0n, 0n, 0n, 0n]],
  ['a counter beyond 2^53', [2n ** 60n, 0n, 0n, 0n, 0n]],
] as const) {
  test(`rpc blockStats: a reply with ${what} is refused as a protocol error`, async () => {
    const d = await statsDaemon([...stats]);
    const s = await RemoteSession.open({ socketPath: d.path, name: 'qemu:///fake', deadline: now() + 5_000 });
    try {
      const e = await s.blockStats(DOM, 'sdzz', now() + 5_000).then(
        () => undefined,
        (err: unknown) => err,
      );
      assert.ok(e instanceof VmseedError, String(e));
      assert.equal(e.code, 'LIBVIRT_PROTOCOL', e.message);
    } finally {
      s.conn.destroy();
      await d.close();
    }
  });
}

test('virsh domblkstat: the five fields read from libvirt 9 output (extra fields ignored), missing ones -1', () => {
  const out = [
    'sdzz rd_req 7',
    'sdzz rd_bytes 28672',
    'sdzz wr_req 0',
    'sdzz wr_bytes 0',
    'sdzz flush_operations 0',
    'sdzz rd_total_times 1234567',
    '',
  ].join('\n');
  assert.deepEqual(parseVirshBlockStats(out), { rdReq: 7, rdBytes: 28672, wrReq: 0, wrBytes: 0, errs: -1 });
  assert.throws(
    () => parseVirshBlockStats('error: nothing\n'),
    (e: VmseedError) => e.code === 'VIRSH_FAILED',
  );
});
