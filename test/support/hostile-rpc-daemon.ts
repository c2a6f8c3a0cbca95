// Building blocks for a hostile libvirt daemon on the scripted fake
// (fake-rpc-daemon.ts): a frame written one byte at a time, a reply that
// announces more than it sends, and a measure of what a run retained.
import type { Socket } from 'node:net';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { PROGRAM, STATUS, TYPE, frame } from './libvirt-wire.ts';

// Writes `bytes` one byte per write, each after the previous one left,
// until they run out or the socket goes.
export async function drip(sock: Socket, bytes: Buffer, gapMs = 0): Promise<number> {
  let sent = 0;
  for (; sent < bytes.length && !sock.destroyed; sent++) {
    const ok = await new Promise<boolean>((r) => sock.write(bytes.subarray(sent, sent + 1), (e) => r(!e)));
    if (!ok) break;
    await new Promise((r) => (gapMs > 0 ? setTimeout(r, gapMs) : setImmediate(r)));
  }
  return sent;
}

// The frame header of a reply to `serial` announcing `total` bytes, for a
// daemon that never sends the rest.
export function replyHead(serial: number, total: number): Buffer {
  const full = frame({ prog: PROGRAM.REMOTE, vers: 1, proc: 1, type: TYPE.REPLY, serial, status: STATUS.OK });
  full.writeUInt32BE(total, 0);
  return full;
}

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;

// Heap plus ArrayBuffer bytes after a full collection: what is retained.
export function retainedBytes(): number {
  gc();
  const m = process.memoryUsage();
  return m.heapUsed + m.arrayBuffers;
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

// Writes, and waits for the socket to drain (or to go).
export async function send(sock: Socket, bytes: Buffer): Promise<void> {
  if (sock.write(bytes) || sock.destroyed) return;
  await new Promise<void>((r) => {
    const done = () => {
      sock.off('drain', done);
      sock.off('close', done);
      r();
    };
    sock.on('drain', done);
    sock.on('close', done);
  });
}

export async function until(what: () => boolean, ms: number): Promise<boolean> {
  const end = Date.now() + ms;
  while (!what()) {
    if (Date.now() > end) return false;
    await sleep(10);
  }
  return true;
}
