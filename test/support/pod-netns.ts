// A network namespace standing for a pod's (or, for a hostNetwork pod, its
// node's), joined to the test's own namespace by a veth pair: the test
// reaches the pod's address as the kubelet's probes and the API server's
// webhook calls do, and the pod reaches a server of the test's on the other
// end's address, as it reaches the API server through the `kubernetes`
// Service. Listeners on 0.0.0.0 inside collide with nothing else on the
// machine. The addresses are a /30 from 198.18.0.0/15 (RFC 2544,
// benchmarking) not in use here; removing the namespace removes the pair.
import { randomBytes, randomInt } from 'node:crypto';
import { sh } from './netns.ts';

export interface PodNetns {
  name: string;
  // Inside: the pod's IP (the node's, for a hostNetwork pod).
  podIP: string;
  // Outside, in the test's namespace: where the pod reaches the test.
  hostIP: string;
  remove(): Promise<void>;
}

export async function makePodNetns(): Promise<PodNetns> {
  const id = randomBytes(3).toString('hex');
  const name = `vmseed-${id}-pod`;
  const outside = `vmsp${id}`;
  const { stdout } = await sh(['ip', '-4', '-o', 'addr', 'show']);
  let base: number;
  let prefix: string;
  do {
    base = randomInt(0, 1 << 15) * 4; // a /30 within 198.18.0.0/15
    prefix = `198.${18 + (base >> 16)}.${(base >> 8) & 255}.`;
  } while (stdout.includes(` ${prefix}${(base & 255) + 1}/`) || stdout.includes(` ${prefix}${(base & 255) + 2}/`));
  const hostIP = `${prefix}${(base & 255) + 1}`;
  const podIP = `${prefix}${(base & 255) + 2}`;
  let made = false;
  const remove = async () => {
    if (made) await sh(['ip', 'netns', 'del', name]).catch(() => {});
    made = false;
  };
  try {
    await sh(['ip', 'netns', 'add', name]);
    made = true;
    await sh(['ip', '-n', name, 'link', 'set', 'lo', 'up']);
    await sh(['ip', 'link', 'add', outside, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', name]);
    await sh(['ip', 'addr', 'add', `${hostIP}/30`, 'dev', outside]);
    await sh(['ip', 'link', 'set', outside, 'up']);
    await sh(['ip', '-n', name, 'addr', 'add', `${podIP}/30`, 'dev', 'eth0']);
    await sh(['ip', '-n', name, 'link', 'set', 'eth0', 'up']);
  } catch (e) {
    await sh(['ip', 'link', 'del', outside]).catch(() => {});
    await remove();
    throw e;
  }
  return { name, podIP, hostIP, remove };
}
