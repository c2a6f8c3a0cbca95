// The agent's libvirt dialling (RpcConnection.open) in a process of its own,
// for the socket-swap test to run as the DaemonSet's user: opens `count`
// connections to `socketPath` one after another, asks each daemon its
// library version (every fake daemon answers its own) and prints a tally as
// one JSON line. It stops early after SECONDS, so a starved run ends.
// Usage: node socket-swap-client.ts SOCKET COUNT SECONDS
import { RpcConnection, now } from '../../src/libvirt/rpc/rpc-connection.ts';
import { RemoteProc } from '../../src/libvirt/rpc/protocol.ts';
import { XdrReader } from '../../src/libvirt/rpc/xdr.ts';

const [socketPath, countArg, secondsArg] = process.argv.slice(2);
const end = Date.now() + Number(secondsArg) * 1000;
const tally: Record<string, number> = {};
const bump = (k: string) => (tally[k] = (tally[k] ?? 0) + 1);
for (let i = 0; i < Number(countArg) && Date.now() < end; i++) {
  let conn: RpcConnection | undefined;
  try {
    conn = await RpcConnection.open({ socketPath, deadline: now() + 5_000 });
    const reply = await conn.call(RemoteProc.CONNECT_GET_LIB_VERSION, Buffer.alloc(0), now() + 5_000, 'version');
    bump(`daemon-${new XdrReader(reply).u64()}`);
  } catch (e) {
    bump((e as { code?: string }).code ?? 'other');
  } finally {
    conn?.destroy();
  }
}
process.stdout.write(`${JSON.stringify(tally)}\n`);
