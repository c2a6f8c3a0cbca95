// Shared by the datasource tests: an in-memory SeedDirectory, keys, seeds,
// a quiet logger, and cloud-init's own reader run as a child process.
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import pino from 'pino';
import type { Seed } from '../../src/cloudinit/seed.ts';
import type { DatasourceFile } from '../../src/datasource/files.ts';
import type { SeedDirectory, SeedDirectoryEntry } from '../../src/datasource/types.ts';

export const quietLogger = pino({ level: 'silent' });

export function randomKey(): Uint8Array {
  return new Uint8Array(randomBytes(32));
}

export function keyLine(k: Uint8Array): string {
  return Buffer.from(k).toString('base64');
}

export function nocloudSeed(n: string, extra: Partial<Seed> = {}): Seed {
  return {
    datasource: 'nocloud',
    metaData: { 'instance-id': `iid-${n}`, 'local-hostname': `host-${n}` },
    userData: new TextEncoder().encode(`#cloud-config\nhostname: host-${n}\nruncmd:\n  - echo secret-of-${n}\n`),
    vendorData: new TextEncoder().encode(`#cloud-config\nbootcmd: [echo vendor-${n}]\n`),
    networkConfig: new TextEncoder().encode('version: 2\nethernets:\n  eth0:\n    dhcp4: true\n'),
    warnings: [],
    ...extra,
  };
}

export class MapDirectory implements SeedDirectory {
  readonly entries = new Map<string, SeedDirectoryEntry>();
  readonly addresses = new Map<string, string[]>(); // address -> uids
  readonly fetches: Array<{ namespace: string; name: string; file: DatasourceFile; at: Date }> = [];
  revision = 0;
  listCalls = 0;

  add(entry: SeedDirectoryEntry, addresses: string[] = []): void {
    this.entries.set(entry.uid, entry);
    for (const a of addresses) this.addresses.set(a, [...(this.addresses.get(a) ?? []), entry.uid]);
    this.revision++;
  }

  remove(uid: string): void {
    this.entries.delete(uid);
    this.revision++;
  }

  get(uid: string): SeedDirectoryEntry | undefined {
    return this.entries.get(uid);
  }

  listUids(): Iterable<string> {
    this.listCalls++;
    return this.entries.keys();
  }

  byAddress(address: string): SeedDirectoryEntry | undefined {
    const uids = this.addresses.get(address) ?? [];
    return uids.length === 1 ? this.entries.get(uids[0]) : undefined;
  }

  recordFetch(namespace: string, name: string, file: DatasourceFile, at: Date): void {
    this.fetches.push({ namespace, name, file, at });
  }

  readonly late: Array<{ uid: string; missedAt: Date; servedAt: Date }> = [];
  recordSeededAfterBoot(entry: SeedDirectoryEntry, missedAt: Date, servedAt: Date): void {
    this.late.push({ uid: entry.uid, missedAt, servedAt });
  }
}

export interface CloudInitRead {
  ok: boolean;
  md?: unknown;
  ud?: string; // base64
  vd?: string | null; // base64
  error?: string;
}

// cloudinit.util.read_seeded from the Debian cloud-init package, exactly as
// DataSourceNoCloud calls it, except retries (the default 10 retries with a
// 1 s pause would make a 404 on vendor-data cost 10 s).
const READ_SEEDED = `
import base64, json, sys
from cloudinit import util
try:
    md, ud, vd = util.read_seeded(sys.argv[1], timeout=5, retries=int(sys.argv[2]))
    b = lambda x: None if x is None else base64.b64encode(x if isinstance(x, bytes) else x.encode()).decode()
    print(json.dumps({"ok": True, "md": md, "ud": b(ud), "vd": b(vd)}))
except Exception as e:
    print(json.dumps({"ok": False, "error": type(e).__name__ + ": " + str(e)}))
`;

export function cloudInitReadSeeded(base: string, retries = 0): Promise<CloudInitRead> {
  return new Promise((resolve, reject) => {
    execFile(
      '/usr/bin/python3',
      ['-c', READ_SEEDED, base, String(retries)],
      { timeout: 60_000 },
      (err, stdout, stderr) => {
        if (err) return reject(new Error(`python3 failed: ${err.message}\n${stderr}`));
        resolve(JSON.parse(stdout) as CloudInitRead);
      },
    );
  });
}

export interface RawResponse {
  status: number;
  headers: Record<string, string>;
  body: Buffer;
}

// One request over a fresh socket, with the request target sent byte for
// byte (fetch and node:http normalise or refuse odd targets; attackers do not).
export function rawRequest(
  port: number,
  target: string | Buffer,
  options: { method?: string; headers?: string[]; body?: string } = {},
): Promise<RawResponse> {
  return import('node:net').then(
    ({ connect }) =>
      new Promise<RawResponse>((resolve, reject) => {
        const socket = connect(port, '127.0.0.1');
        const chunks: Buffer[] = [];
        socket.setTimeout(10_000, () => socket.destroy(new Error('raw request timed out')));
        socket.on('data', (c) => chunks.push(c));
        socket.on('error', reject);
        socket.on('close', () => {
          const all = Buffer.concat(chunks);
          const split = all.indexOf('\r\n\r\n');
          if (split < 0) return reject(new Error(`no HTTP response (${all.length} bytes)`));
          const [statusLine, ...lines] = all.subarray(0, split).toString('latin1').split('\r\n');
          const headers: Record<string, string> = {};
          for (const l of lines) {
            const i = l.indexOf(':');
            headers[l.slice(0, i).toLowerCase()] = l.slice(i + 1).trim();
          }
          resolve({ status: Number(statusLine.split(' ')[1]), headers, body: all.subarray(split + 4) });
        });
        const head = Buffer.concat([
          Buffer.from(`${options.method ?? 'GET'} `),
          Buffer.isBuffer(target) ? target : Buffer.from(target, 'utf8'),
          Buffer.from(
            ` HTTP/1.1\r\nHost: 169.254.169.254\r\nConnection: close\r\n${(options.headers ?? []).map((h) => h + '\r\n').join('')}\r\n${options.body ?? ''}`,
          ),
        ]);
        socket.write(head);
      }),
  );
}
