// virsh as the agent runs it (the Virsh runner with the real spawner, so
// the socket is held and handed over as the agent does) in a process of its
// own, for the virsh socket-swap test to run as the DaemonSet's user: runs
// `virsh capabilities` on URI up to COUNT times, one after another, and
// prints a tally by the host UUID each daemon answered with (every replica
// launcher has its own) or by error code, as one JSON line. It stops early
// after SECONDS, so a starved run ends.
// Usage: node virsh-swap-client.ts URI COUNT SECONDS
import { NodeProcessSpawner, Virsh } from '../../src/libvirt/virsh/runner.ts';

const [uri, countArg, secondsArg] = process.argv.slice(2);
const end = Date.now() + Number(secondsArg) * 1000;
const virsh = new Virsh({
  virshPath: 'virsh',
  uri,
  timeoutMs: 10_000,
  maxOutputBytes: 1 << 20,
  spawner: new NodeProcessSpawner(),
});
const tally: Record<string, number> = {};
const bump = (k: string) => (tally[k] = (tally[k] ?? 0) + 1);
for (let i = 0; i < Number(countArg) && Date.now() < end; i++) {
  try {
    const caps = await virsh.run(['capabilities']);
    bump(`host-${/<uuid>([^<]+)<\/uuid>/.exec(caps)?.[1] ?? 'none'}`);
  } catch (e) {
    bump((e as { code?: string }).code ?? 'other');
  }
}
process.stdout.write(`${JSON.stringify(tally)}\n`);
