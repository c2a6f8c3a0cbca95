// Which way the e2e suites reach libvirt: VMSEED_E2E_LIBVIRT=virsh (default,
// one virsh process per call) or rpc (libvirt's protocol, one socket per
// URI, events). The same tests run on either; run a file once per mode.
import { after } from 'node:test';
import { LibvirtInjector, type LibvirtInjectorOptions } from '../../src/libvirt/injector.ts';
import { RpcLibvirtClient } from '../../src/libvirt/rpc/rpc-client.ts';

export type E2eLibvirtMode = 'virsh' | 'rpc';

export const E2E_LIBVIRT: E2eLibvirtMode = (() => {
  const v = process.env.VMSEED_E2E_LIBVIRT ?? 'virsh';
  if (v !== 'virsh' && v !== 'rpc') throw new Error(`VMSEED_E2E_LIBVIRT=${v}: use virsh or rpc`);
  return v;
})();

let shared: RpcLibvirtClient | undefined;
const opened: Array<{ close(): Promise<void> }> = [];
// One RPC client per test file (its sockets closed when the file ends).
export function e2eRpcClient(): RpcLibvirtClient {
  shared ??= closeLater(new RpcLibvirtClient({ timeoutMs: 60_000 }));
  return shared;
}
export function closeLater<T extends { close(): Promise<void> }>(c: T): T {
  opened.push(c);
  return c;
}
after(async () => {
  await Promise.all(opened.map((c) => c.close()));
});

// An injector on the mode's client. Options naming virsh itself (a wrapper
// script, a missing binary) keep the virsh client: they test virsh.
export function e2eInjector(o: LibvirtInjectorOptions = {}): LibvirtInjector {
  if (E2E_LIBVIRT === 'rpc' && o.virshPath === undefined && o.client === undefined) {
    return new LibvirtInjector({ ...o, client: o.timeoutMs !== undefined ? ownClient(o.timeoutMs) : e2eRpcClient() });
  }
  return new LibvirtInjector(o);
}

function ownClient(timeoutMs: number): RpcLibvirtClient {
  return closeLater(new RpcLibvirtClient({ timeoutMs }));
}

// The agent's `--libvirt` for this run (agent processes and DaemonSet replicas).
export function e2eAgentLibvirtFlag(): string[] {
  return ['--libvirt', E2E_LIBVIRT];
}
