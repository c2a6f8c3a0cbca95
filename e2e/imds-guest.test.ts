// The HTTP datasource's real guest: `vmseed agent --local` with its NoCloud HTTP
// datasource on 127.0.0.1, a VMI file dropped in, and the busybox guest
// (real Debian kernel under QEMU TCG, no disk attached) fetching its seed
// over HTTP through QEMU user networking with restrict=on and a guestfwd to
// the agent (no packet leaves the machine). What the guest prints must be
// the bytes of the seed image the agent wrote.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { mkdir, rename, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { tempDir, waitFor } from '../test/support/agent-harness.ts';
import { readIso } from '../src/disk/iso9660-read.ts';
import { runCli } from '../test/support/cli.ts';
import { bootWithImage } from './support/guest/qemu.ts';

const ROOT = new URL('../', import.meta.url).pathname;
const GUEST_IP = '10.0.2.100';
const UID = '6f1c1c2e-4f6e-4c55-9a57-0d4b1f3b9e21';

async function put(path: string, text: string): Promise<void> {
  await writeFile(`${path}.partial`, text);
  await rename(`${path}.partial`, path);
}

test(
  'a real guest fetches its seed over HTTP from the agent (restrict=on, guestfwd to the datasource listener)',
  { timeout: 180_000 },
  async (t) => {
    const dir = await tempDir('vmseed-imds-guest-');
    const manifests = join(dir.path, 'manifests');
    const state = join(dir.path, 'seeds');
    await mkdir(manifests);
    const keyFile = join(dir.path, 'datasource-keys');
    await writeFile(keyFile, `${randomBytes(32).toString('base64')}\n`);
    // Operator-wide vendor-data from a ConfigMap (--vendor-data-from), served too.
    await put(
      join(manifests, 'vendor.yaml'),
      `apiVersion: v1
kind: ConfigMap
metadata: {name: vendor, namespace: default}
data:
  vendor-data: |
    #cloud-config
    write_files: [{path: /etc/from-vendor, content: "vendor ok"}]
`,
    );

    const child = spawn(
      process.execPath,
      [
        join(ROOT, 'src/main.ts'),
        'agent',
        '--local',
        manifests,
        '--state-dir',
        state,
        '--listen',
        '127.0.0.1:0',
        '--datasource-listen',
        '127.0.0.1:0',
        '--datasource-key-file',
        keyFile,
        '--datasource-base-url',
        `http://${GUEST_IP}/v1`,
        '--vendor-data-from',
        'default/vendor',
        '--log-level',
        'debug',
      ],
      { cwd: dir.path, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let log = '';
    child.stdout.on('data', (d) => (log += d));
    child.stderr.on('data', (d) => (log += d));
    const exited = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
    t.after(async () => {
      if (child.exitCode === null) child.kill('SIGKILL');
      await dir.remove();
    });

    const statusUrl = await waitFor(
      'status listener',
      () => /"url":"(http:\/\/127\.0\.0\.1:\d+)"/.exec(log)?.[1],
      15_000,
    );
    const dsPort = Number(
      await waitFor(
        'datasource listener',
        () => /"port":(\d+)[^\n]*NoCloud HTTP datasource listening/.exec(log)?.[1],
        15_000,
      ),
    );
    assert.ok(dsPort > 0);

    // The VMI arrives after the agent is up, as in a cluster.
    await put(
      join(manifests, 'guest.yaml'),
      `apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: http-guest
  namespace: default
  uid: ${UID}
  creationTimestamp: "2026-01-02T03:04:05Z"
  annotations:
    vmseed.io/cloud-init: |
      userData: |
        #cloud-config
        hostname: http-guest
        runcmd: ["echo fetched over http ünïcødé"]
spec:
  domain: {}
`,
    );
    const image = await waitFor(
      'seed image',
      () => {
        const found = existsSync(state)
          ? (readdirSync(state, { recursive: true }) as string[]).find((p) =>
              /(^|\/)nocloud-[0-9a-f]{16}\.iso$/.test(p),
            )
          : undefined;
        return found && join(state, found);
      },
      15_000,
    ).catch((e: Error) => {
      // The agent's own account is what explains a missing image.
      throw new Error(`${e.message}\nagent log:\n${log.slice(-4000)}`);
    });
    type Vmi = { name: string; state: string; servedOverHttp?: boolean; lastFetch?: Record<string, string> };
    const statusOf = async () =>
      ((await (await fetch(`${statusUrl}/status.json`)).json()) as { vmis: Vmi[] }).vmis.find(
        (v) => v.name === 'http-guest',
      );
    await waitFor('served over HTTP on /status.json', async () => (await statusOf())?.servedOverHttp, 15_000);
    // The serial comes from seed-url with the key, as an owner gets it; no page shows it.
    const cli = await runCli(
      ['seed-url', 'default/http-guest', '--uid', UID, '--key-file', keyFile, '--base', `http://${GUEST_IP}/v1`],
      dir.path,
    );
    assert.equal(cli.code, 0, cli.err);
    const serial = cli.out.toString().trim();
    const m = new RegExp(`^ds=nocloud;s=(http://${GUEST_IP.replaceAll('.', '\\.')}/v1/[A-Za-z0-9_-]{43}/)$`).exec(
      serial,
    );
    assert.ok(m, serial);
    const seedUrl = m[1];

    const iso = readIso(readFileSync(image));
    const fromImage = (name: string) =>
      Buffer.from(iso.read(iso.entries.find((e) => e.path.replace(/^\//, '') === name)!.path)!);

    const r = await bootWithImage({
      url: seedUrl,
      guestfwd: { guestIp: GUEST_IP, guestPort: 80, hostPort: dsPort },
      files: ['meta-data', 'user-data', 'vendor-data', 'network-config'],
      timeoutMs: 120_000,
    });
    assert.equal(r.done, true, 'guest finished');
    for (const f of ['meta-data', 'user-data', 'vendor-data']) {
      assert.ok(r.files.get(f), `guest printed ${f}`);
      assert.deepEqual(r.files.get(f), fromImage(f), `${f}: the guest got the image's bytes`);
    }
    assert.match(r.files.get('user-data')!.toString(), /fetched over http ünïcødé/);
    // The operator's vendor-data is the first part of a MIME message (base64,
    // byte for byte), the progress-reporting cloud-config the second.
    const vendor = r.files.get('vendor-data')!.toString();
    const [, first] = vendor.split(/\n--==vmseed-[0-9a-f]+==\n/);
    assert.match(Buffer.from(first.slice(first.indexOf('\n\n') + 2), 'base64').toString(), /vendor ok/);
    assert.match(vendor, /filename="vmseed-reporting\.cfg"\n\n#cloud-config\nreporting:/);
    // No network-config in this seed: served empty (none to cloud-init, DHCP fallback).
    assert.deepEqual(r.missing, []);
    assert.equal(r.files.get('network-config')!.length, 0);

    // The agent saw the guest ask.
    const fetched = await waitFor('lastFetch', async () => (await statusOf())?.lastFetch, 5_000);
    assert.deepEqual(Object.keys(fetched).sort(), ['meta-data', 'network-config', 'user-data', 'vendor-data']);

    // A token of another key (a guest guessing) gets nothing.
    const wrong = seedUrl.replace(
      /\/v1\/[A-Za-z0-9_-]{43}\//,
      `/v1/${randomBytes(32).toString('base64url').slice(0, 43)}/`,
    );
    const bad = await bootWithImage({
      url: wrong,
      guestfwd: { guestIp: GUEST_IP, guestPort: 80, hostPort: dsPort },
      files: ['user-data'],
      timeoutMs: 90_000,
    });
    assert.equal(bad.done, true);
    assert.deepEqual(bad.missing, ['user-data']);

    child.kill('SIGTERM');
    assert.equal(await exited, 0, log.slice(-2000));
  },
);
