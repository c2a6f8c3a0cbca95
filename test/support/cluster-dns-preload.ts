// Cluster DNS for a process the kubelet stand-in (kubelet.ts) starts, as
// the kubelet points a pod's resolv.conf at the cluster's DNS: loaded with
// NODE_OPTIONS=--import, it answers `<service>.<namespace>.svc` (and
// `.svc.cluster.local`) from the records cluster-dns.ts keeps in
// /run/vmseed-dns/hosts.json (the addresses of the Ready pods each Service
// selects), and leaves every other name to the real dns.lookup. A stand-in
// for tests only: never part of the image.
import dns from 'node:dns';
import { readFileSync } from 'node:fs';

const HOSTS = '/run/vmseed-dns/hosts.json';
type Callback = (err: NodeJS.ErrnoException | null, address?: unknown, family?: number) => void;

function serviceName(hostname: string): string | undefined {
  const name = hostname
    .toLowerCase()
    .replace(/\.$/, '')
    .replace(/\.cluster\.local$/, '');
  return /^[a-z0-9-]+\.[a-z0-9-]+\.svc$/.test(name) ? name : undefined;
}

function records(name: string): string[] {
  try {
    return (JSON.parse(readFileSync(HOSTS, 'utf8')) as Record<string, string[]>)[name] ?? [];
  } catch {
    return [];
  }
}

const realLookup = dns.lookup;
function lookup(hostname: string, options: unknown, callback?: Callback): void {
  const cb = (typeof options === 'function' ? options : callback) as Callback;
  const opts = (typeof options === 'object' && options !== null ? options : {}) as { all?: boolean };
  const name = serviceName(hostname);
  if (name === undefined) return void (realLookup as (...a: unknown[]) => void)(hostname, options, callback);
  const ips = records(name);
  process.nextTick(() => {
    if (ips.length === 0) {
      const err: NodeJS.ErrnoException = new Error(`getaddrinfo ENOTFOUND ${hostname}`);
      err.code = 'ENOTFOUND';
      err.syscall = 'getaddrinfo';
      return cb(err);
    }
    if (opts.all)
      return cb(
        null,
        ips.map((address) => ({ address, family: 4 })),
      );
    cb(null, ips[0], 4);
  });
}
dns.lookup = lookup as typeof dns.lookup;
