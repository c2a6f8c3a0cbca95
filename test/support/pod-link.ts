// Two pods' network namespaces (pod-netns.ts) on one pod network, as a CNI
// joins the pods of a cluster: a veth pair between the two namespaces, with
// a host route each way to the other pod's address (its own address as the
// source, so each sees the other's pod IP, as on a flat pod network). And
// each pod reaches the other's `hostIP` (where a server of the test's, the
// fake API server, listens) through its own end to the test's namespace,
// where that address is local: no forwarding on the machine is needed.
// Removing either namespace removes the pair.
import { randomBytes } from 'node:crypto';
import { sh } from './netns.ts';
import type { PodNetns } from './pod-netns.ts';

export async function linkPodNetns(a: PodNetns, b: PodNetns): Promise<void> {
  const id = randomBytes(3).toString('hex');
  const [inA, inB] = [`pl${id}a`, `pl${id}b`];
  await sh(['ip', '-n', a.name, 'link', 'add', inA, 'type', 'veth', 'peer', 'name', inB, 'netns', b.name]);
  for (const [ns, dev, self, other] of [
    [a, inA, a, b],
    [b, inB, b, a],
  ] as const) {
    await sh(['ip', '-n', ns.name, 'link', 'set', dev, 'up']);
    await sh(['ip', '-n', ns.name, 'route', 'add', `${other.podIP}/32`, 'dev', dev, 'src', self.podIP]);
    await sh(['ip', '-n', ns.name, 'route', 'add', `${other.hostIP}/32`, 'via', self.hostIP]);
  }
}
