// SLOW (two boots one at a time, each 1-7 min under TCG depending on the
// machine's load): the Debian guest
// (cloud-init 22.4) boots on a seed vmseed renders with the reporting part
// pointing at a recorder on the host (QEMU user networking; guestfwd relays
// 10.0.2.100:80 to it), and cloud-init's webhook handler posts its events
// there:
//   - a good seed: every stage cloud-init reports on a first boot finishes
//     SUCCESS (init-network, modules-config, modules-final; on a first boot
//     init-local runs before the reporting configuration exists and is not
//     posted);
//   - a seed whose runcmd exits non-zero and whose cloud-config breaks the
//     schema: modules-final/config-scripts-user (Debian 12's cloud.cfg
//     spells the module scripts-user) finishes FAIL and so does
//     modules-final; the schema error is not reported at all (22.4 only logs
//     it, in init-network before reporting is configured, and never sends
//     WARN), and every other stage still finishes SUCCESS.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { VmiObject } from '../src/api/objects.ts';
import { MemoryResolver } from '../src/cloudinit/refs/memory-resolver.ts';
import { DEFAULT_RENDER_OPTIONS, renderSeed } from '../src/cloudinit/render.ts';
import { buildSeedImage } from '../src/disk/seed-image.ts';
import { DatasourceKeyring } from '../src/datasource/tokens.ts';
import { REPORT_PATH_NAME, reportToken, reportUrl } from '../src/datasource/reports/report-token.ts';
import { randomKey } from '../test/datasource/datasource-fixtures.ts';
import { cloneRootfs, cloudInitFinished, ensureDebianGuest } from './support/guest/debian.ts';
import { runQemu } from './support/guest/qemu.ts';

interface Event {
  event_type: string;
  name: string;
  result?: string;
  description: string;
  origin: string;
  timestamp: number;
}

const GUEST_IP = '10.0.2.100';
// QEMU's user network, statically: a DHCP client in the guest can stall
// networking.service for minutes on a loaded machine.
const STATIC_NET =
  'version: 2\nethernets:\n  eth0:\n    addresses: [10.0.2.15/24]\n    routes: [{to: 0.0.0.0/0, via: 10.0.2.2}]\n';

async function recorder(): Promise<{ server: Server; port: number; requests: Array<{ path: string; event: Event }> }> {
  const requests: Array<{ path: string; event: Event }> = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      if (req.method === 'POST')
        requests.push({ path: req.url!, event: JSON.parse(Buffer.concat(chunks).toString('utf8')) as Event });
      res.writeHead(200).end();
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { server, port: (server.address() as AddressInfo).port, requests };
}

function volumeVmi(uid: string, userData: string): VmiObject {
  return {
    apiVersion: 'kubevirt.io/v1',
    kind: 'VirtualMachineInstance',
    metadata: { name: 'progress', namespace: 'default', uid },
    spec: {
      domain: { devices: { disks: [{ name: 'cloudinitdisk', disk: { bus: 'virtio' } }] } },
      volumes: [{ name: 'cloudinitdisk', cloudInitNoCloud: { userData, networkData: STATIC_NET } }],
    },
  };
}

const finished = (events: Event[], name: string) =>
  events.find((e) => e.event_type === 'finish' && e.name === name)?.result;

// Boots a fresh guest on the seed with the reporting part; returns what was
// posted once modules-final's finish arrived (cloud-init flushes its
// queue before the stage's process exits).
async function bootReporting(dir: string, uid: string, userData: string): Promise<Event[]> {
  const rec = await recorder();
  try {
    const keyring = new DatasourceKeyring([randomKey()]);
    const token = reportToken(keyring, uid);
    const outcome = await renderSeed(volumeVmi(uid, userData), new MemoryResolver({}), DEFAULT_RENDER_OPTIONS, {
      reportUrl: reportUrl(`http://${GUEST_IP}/v1`, token),
    });
    assert.ok(outcome.kind === 'seed');
    assert.ok(outcome.seed.vendorData, 'the seed carries the reporting part');
    const iso = path.join(dir, `${uid}.iso`);
    await writeFile(iso, buildSeedImage(outcome.seed, new Date()).bytes);
    const guest = await ensureDebianGuest();
    const root = await cloneRootfs(dir, guest.rootfs);
    const stop = new AbortController();
    const watch = (async () => {
      while (!stop.signal.aborted) {
        if (
          finished(
            rec.requests.map((r) => r.event),
            'modules-final',
          )
        )
          return stop.abort();
        await sleep(500);
      }
    })();
    const run = await runQemu({
      kernel: guest.kernel,
      initrd: guest.initramfs,
      append: guest.cmdline,
      drives: [
        { path: root.path, format: root.format, readonly: false },
        { path: iso, format: 'raw', readonly: true },
      ],
      net: { guestfwd: { guestIp: GUEST_IP, guestPort: 80, hostPort: rec.port } },
      memoryMb: 512,
      // A boot under TCG took over 400 s with the machine loaded by parallel runs.
      timeoutMs: 600_000,
      consoleFile: process.env.VMSEED_PROGRESS_EVENTS
        ? `${process.env.VMSEED_PROGRESS_EVENTS}-${uid}-console.log`
        : path.join(dir, `${uid}-console.log`),
      signal: stop.signal,
    });
    stop.abort();
    await watch;
    const events = rec.requests.map((r) => r.event);
    await writeFile(path.join(dir, `${uid}-events.json`), JSON.stringify(events, null, 2));
    if (process.env.VMSEED_PROGRESS_EVENTS)
      await writeFile(`${process.env.VMSEED_PROGRESS_EVENTS}-${uid}.json`, JSON.stringify(rec.requests, null, 2));
    const tail = `events: ${events.map((e) => `${e.event_type} ${e.name} ${e.result ?? ''}`).join('; ')}\nconsole tail:\n${run.console.slice(-3000)}`;
    assert.ok(cloudInitFinished(run.console), `cloud-init finished; ${tail}`);
    assert.ok(finished(events, 'modules-final'), `modules-final's finish was posted; ${tail}`);
    for (const r of rec.requests) assert.equal(r.path, `/v1/${token}/${REPORT_PATH_NAME}`);
    console.log(
      `# debian guest ${uid}: ${events.length} events posted, cloud-init done after ${run.seconds.toFixed(1)} s wall`,
    );
    return events;
  } finally {
    await new Promise<void>((r) => rec.server.close(() => r()));
  }
}

test(
  'SLOW: Debian guest (cloud-init 22.4) posts its progress: SUCCESS for a good seed; FAIL naming scripts-user for a failing runcmd; no schema warning',
  { timeout: 1_300_000 },
  async () => {
    const dir = await mkdtemp(path.join(tmpdir(), 'vmseed-debian-progress-'));
    try {
      const good = await bootReporting(
        dir,
        'good-2f0c7e1a',
        '#cloud-config\nwrite_files:\n  - {path: /etc/vmseed-progress, content: "ok\\n"}\nruncmd:\n  - [sh, -c, "echo VMSEED-PROGRESS-GOOD"]\n',
      );
      for (const stage of ['init-network', 'modules-config', 'modules-final'])
        assert.equal(finished(good, stage), 'SUCCESS', `${stage} finished SUCCESS`);
      assert.equal(finished(good, 'modules-final/config-scripts-user'), 'SUCCESS');
      assert.ok(!good.some((e) => e.name === 'init-local'), 'init-local is not reported on a first boot');
      assert.ok(
        good.every((e) => e.event_type !== 'finish' || e.result === 'SUCCESS'),
        'every finish of a good seed is SUCCESS',
      );

      const bad = await bootReporting(
        dir,
        'bad-8d41b3c9',
        '#cloud-config\nwrite_files:\n  - {path: /etc/vmseed-progress, content: "x\\n", bogus: 1}\n' +
          'runcmd:\n  - [sh, -c, "echo VMSEED-PROGRESS-BAD; exit 3"]\n',
      );
      assert.equal(finished(bad, 'modules-final/config-scripts-user'), 'FAIL');
      assert.equal(finished(bad, 'modules-final'), 'FAIL');
      for (const stage of ['init-network', 'modules-config'])
        assert.equal(finished(bad, stage), 'SUCCESS', `${stage} finished SUCCESS`);
      assert.ok(!bad.some((e) => e.result === 'WARN'), '22.4 never reports WARN');
      assert.ok(
        !bad.some((e) => /schema|bogus|write_files\.0/i.test(e.description)),
        'the schema error is not in any event',
      );
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  },
);
