// Timers shared by bench:inject and its launcher child.
import { setTimeout as sleep } from 'node:timers/promises';

export async function time(fn: () => Promise<unknown>): Promise<number> {
  const t = process.hrtime.bigint();
  await fn();
  return Number(process.hrtime.bigint() - t) / 1e6;
}

// Every call of a loop whose rows are compared with each other is timed
// after the same pause. Without it the first call after an idle moment
// (this machine's vCPUs and QEMU's main loop asleep) paid for waking them
// and the calls right behind it did not; and a call right after a virsh
// queued behind libvirtd's handling of that client's disconnect. An agent
// seeds after idle moments too.
export const SETTLE_MS = 20;

export async function timeSettled(fn: () => Promise<unknown>): Promise<number> {
  await sleep(SETTLE_MS);
  return time(fn);
}
