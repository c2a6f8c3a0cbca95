// The progress-reporting part of a seed, as cloud-init's own code takes it
// (progress_report.py: cloud-init's datasource, stages.Init consuming
// user-data then vendor-data, helpers.ConfigMerger, apply_reporting_cfg and
// the reporting handlers):
//   - the user's user-data is applied identically with and without it: the
//     same processed parts, the same user cloud-config, the same merged
//     configuration but for `reporting`;
//   - the VMI's own vendor-data is applied as before, with `reporting` beside it;
//   - `vendor_data: {enabled: false}` in user-data drops it, and a user's
//     `reporting: {vmseed: null}` turns the handler off;
//   - with the configuration from a rendered seed, cloud-init 22.4 (installed)
//     and 25.1 (Debian trixie) post their events to a loopback recorder: the
//     requests are kept in test/fixtures/cloud-init-events/<release>/.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { gzipSync } from 'node:zlib';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { VmiObject } from '../../src/api/objects.ts';
import { MemoryResolver } from '../../src/cloudinit/refs/memory-resolver.ts';
import { DEFAULT_RENDER_OPTIONS, renderSeed } from '../../src/cloudinit/render.ts';
import { serializeMetaData } from '../../src/cloudinit/seed-files.ts';
import type { Seed } from '../../src/cloudinit/seed.ts';
import {
  REPORT_PROGRESS_ANNOTATION,
  reportingCloudConfig,
  reportProgressWanted,
  withReportingPart,
} from '../../src/cloudinit/userdata/reporting-config.ts';
import { VmseedError } from '../../src/errors.ts';
import { DatasourceKeyring } from '../../src/datasource/tokens.ts';
import { REPORT_PATH_NAME, reportToken, reportUrl } from '../../src/datasource/reports/report-token.ts';
import { ensureCloudInitRelease } from '../support/cloud-init-release.ts';
import { runCase } from './corpus-lib.ts';

const SCRIPT = fileURLToPath(new URL('./progress_report.py', import.meta.url));
const FIXTURES = fileURLToPath(new URL('../fixtures/cloud-init-events/', import.meta.url));
// A fixed key and UID (token.json), so the fixtures' paths hold a token the
// receiver's tests can verify.
const TOKEN = JSON.parse(readFileSync(join(FIXTURES, 'token.json'), 'utf8')) as {
  key: string;
  uid: string;
  token: string;
};
const FIXTURE_UID = TOKEN.uid;
const keyring = new DatasourceKeyring([new Uint8Array(Buffer.from(TOKEN.key, 'base64'))]);

interface Consumed {
  id: string;
  ok: boolean;
  error?: string;
  userData: Array<[string, string | null, string]>;
  cloudConfig: Record<string, unknown> | null;
  vendorCloudConfig: Record<string, unknown> | null;
  vendorSchemaErrors: string | null;
  merged: Record<string, unknown>;
}

function runCloudInit(request: unknown, pythonPath?: string): Promise<{ seeds: Consumed[]; reported: boolean }> {
  return new Promise((resolve, reject) => {
    const child = execFile(
      '/usr/bin/python3',
      [SCRIPT],
      { timeout: 180_000, env: { ...process.env, ...(pythonPath ? { PYTHONPATH: pythonPath } : {}) } },
      (err, stdout, stderr) => {
        if (err) return reject(new Error(`progress_report.py failed: ${err.message}\n${stderr}`));
        resolve(JSON.parse(stdout) as { seeds: Consumed[]; reported: boolean });
      },
    );
    child.stdin!.end(JSON.stringify(request));
  });
}

function writeSeed(dir: string, seed: Seed): void {
  for (const f of serializeMetaData(seed)) {
    mkdirSync(dirname(join(dir, f.path)), { recursive: true });
    writeFileSync(join(dir, f.path), f.bytes);
  }
}

function withoutReporting(cfg: Record<string, unknown>): Record<string, unknown> {
  const { reporting: _r, system_info: _s, ...rest } = cfg;
  return rest;
}

const ENDPOINT = 'http://169.254.169.254/v1/TOKEN/cloud-init-events';
const expectedHandler = (endpoint: string) => ({ type: 'webhook', endpoint, timeout: 5, retries: 1 });

describe('the reporting part, rendered', () => {
  test('is a #cloud-config of one webhook handler, named vmseed', () => {
    assert.equal(
      reportingCloudConfig(ENDPOINT),
      '#cloud-config\nreporting:\n  vmseed:\n    type: webhook\n' +
        `    endpoint: "${ENDPOINT}"\n    timeout: 5\n    retries: 1\n`,
    );
  });

  test("goes beside the VMI's own vendor-data in a MIME message, which a MIME message of its own refuses", () => {
    const own = new TextEncoder().encode('#cloud-config\nntp: {enabled: true}\n');
    const r = withReportingPart(own, ENDPOINT);
    assert.ok('bytes' in r);
    const text = new TextDecoder().decode(r.bytes);
    assert.match(text, /^Content-Type: multipart\/mixed; boundary="==vmseed-[0-9a-f]{32}=="\nMIME-Version: 1.0\n/);
    assert.ok(text.includes(Buffer.from(own).toString('base64')), 'the own vendor-data, base64, unchanged');
    assert.deepEqual(withReportingPart(own, ENDPOINT), r, 'deterministic');
    const mime = new TextEncoder().encode('Content-Type: multipart/mixed; boundary="x"\nMIME-Version: 1.0\n\n--x--\n');
    const refused = withReportingPart(mime, ENDPOINT);
    assert.ok('reason' in refused && /MIME multipart/.test(refused.reason), JSON.stringify(refused));
  });

  test('a seed served over HTTP only (KubeVirt IMDS annotations) carries it too, user-data untouched', async () => {
    const vmi: VmiObject = {
      apiVersion: 'kubevirt.io/v1',
      kind: 'VirtualMachineInstance',
      metadata: {
        name: 'web-1',
        namespace: 'team-a',
        uid: 'u1',
        annotations: { 'imds.kubevirt.io/enabled': 'true', 'imds.kubevirt.io/user-data': '#cloud-config\n' },
      },
      spec: { domain: { devices: {} } },
    };
    const plain = await renderSeed(vmi, new MemoryResolver({}), DEFAULT_RENDER_OPTIONS);
    const reported = await renderSeed(vmi, new MemoryResolver({}), DEFAULT_RENDER_OPTIONS, { reportUrl: ENDPOINT });
    assert.ok(plain.kind === 'seed' && reported.kind === 'seed');
    assert.equal(reported.seed.delivery, 'http');
    assert.deepEqual(reported.seed.userData, plain.seed.userData);
    assert.equal(plain.seed.vendorData, undefined);
    assert.equal(new TextDecoder().decode(reported.seed.vendorData), reportingCloudConfig(ENDPOINT));
  });

  test(`annotation ${REPORT_PROGRESS_ANNOTATION}: "false" opts out, "true" or none keeps it, anything else is refused`, () => {
    const vmi = (v?: string): VmiObject => ({
      apiVersion: 'kubevirt.io/v1',
      kind: 'VirtualMachineInstance',
      metadata: {
        name: 'a',
        namespace: 'ns',
        ...(v !== undefined ? { annotations: { [REPORT_PROGRESS_ANNOTATION]: v } } : {}),
      },
      spec: { domain: { devices: {} } },
    });
    assert.equal(reportProgressWanted(vmi()), true);
    assert.equal(reportProgressWanted(vmi('true')), true);
    assert.equal(reportProgressWanted(vmi('false')), false);
    assert.throws(
      () => reportProgressWanted(vmi('no')),
      (e: unknown) =>
        e instanceof VmseedError &&
        e.code === 'ANNOTATION_INVALID' &&
        e.field === `metadata.annotations.${REPORT_PROGRESS_ANNOTATION}`,
    );
  });
});

// Corpus seeds of both datasources, with user-data of every kind and with
// and without vendor-data of their own (the VMI's, the operator's default).
const CASES = [
  'ann-nocloud-userdata',
  'ann-configdrive',
  'kv-gzip-userdata',
  'kv-cloud-boothook',
  'kv-configdrive-network-json',
  'ov-init-full-nocloud',
  'ov-init-full-configdrive',
  'vt-files',
  'vd-inline-nocloud',
  'vd-configmap-configdrive',
  'vd-operator-default',
];

function userVmi(name: string, datasource: string, userData: string): VmiObject {
  return {
    apiVersion: 'kubevirt.io/v1',
    kind: 'VirtualMachineInstance',
    metadata: {
      name,
      namespace: 'ns',
      uid: FIXTURE_UID,
      annotations: { 'vmseed.io/cloud-init': JSON.stringify({ datasource, userData }) },
    },
    spec: { domain: { devices: {} } },
  };
}

// 22.4 runs each stage in a process of its own; 25.1's systemd units run
// them all in one (cloud-init-main.service, `cloud-init --all-stages`).
const RELEASES = [
  { name: '22.4', pythonPath: async () => undefined, agent: /^Cloud-Init\/22\.4/, singleProcess: false },
  { name: '25.1', pythonPath: () => ensureCloudInitRelease(), agent: /^Cloud-Init\/25\.1/, singleProcess: true },
];

// User-data that turns the part off, each its own way.
const USER_OFF: Array<{ id: string; userData: string }> = [
  { id: 'user-vendor-data-disabled', userData: '#cloud-config\nvendor_data: {enabled: false}\nruncmd: [true]\n' },
  { id: 'user-reporting-null', userData: '#cloud-config\nreporting: {vmseed: null}\n' },
];

for (const rel of RELEASES)
  describe(`cloud-init ${rel.name} applies the user's user-data identically with and without the reporting part`, () => {
    const results = new Map<string, { plain: Consumed; reported: Consumed; seed: Seed }>();
    let tmp = '';
    before(async () => {
      tmp = mkdtempSync(join(tmpdir(), 'vmseed-progress-'));
      const items: Array<{ id: string; dir: string; datasource: string }> = [];
      const seeds = new Map<string, Seed>();
      const add = (id: string, plain: Seed, reported: Seed) => {
        seeds.set(id, reported);
        for (const [suffix, seed] of [
          ['plain', plain],
          ['reported', reported],
        ] as const) {
          const dir = join(tmp, `${id}-${suffix}`);
          writeSeed(dir, seed);
          items.push({ id: `${id}/${suffix}`, dir, datasource: seed.datasource });
        }
      };
      for (const name of CASES) {
        const plain = await runCase(name);
        const reported = await runCase(name, { reportUrl: ENDPOINT });
        assert.ok('outcome' in plain && plain.outcome.kind === 'seed', `${name} renders`);
        assert.ok('outcome' in reported && reported.outcome.kind === 'seed', `${name} renders with the part`);
        add(name, plain.outcome.seed, reported.outcome.seed);
      }
      for (const { id, userData } of USER_OFF) {
        const vmi = userVmi(id, 'nocloud', userData);
        const render = (reportUrl?: string) =>
          renderSeed(vmi, new MemoryResolver({}), DEFAULT_RENDER_OPTIONS, reportUrl ? { reportUrl } : {});
        const [plain, reported] = [await render(), await render(ENDPOINT)];
        assert.ok(plain.kind === 'seed' && reported.kind === 'seed');
        add(id, plain.seed, reported.seed);
      }
      // Gzip vendor-data of the VMI's own (NoCloud takes it as bytes).
      const base = await renderSeed(
        userVmi('gzip', 'nocloud', '#cloud-config\n'),
        new MemoryResolver({}),
        DEFAULT_RENDER_OPTIONS,
      );
      assert.ok(base.kind === 'seed');
      const own = new Uint8Array(gzipSync('#cloud-config\nntp: {enabled: true}\n'));
      const wrapped = withReportingPart(own, ENDPOINT);
      assert.ok('bytes' in wrapped);
      add('vendor-data-gzip', { ...base.seed, vendorData: own }, { ...base.seed, vendorData: wrapped.bytes });
      const out = await runCloudInit({ seeds: items }, await rel.pythonPath());
      for (const id of seeds.keys()) {
        const plain = out.seeds.find((s) => s.id === `${id}/plain`)!;
        const reported = out.seeds.find((s) => s.id === `${id}/reported`)!;
        results.set(id, { plain, reported, seed: seeds.get(id)! });
      }
    });
    after(() => rmSync(tmp, { recursive: true, force: true }));

    for (const name of [...CASES, 'vendor-data-gzip']) {
      test(name, () => {
        const { plain, reported, seed } = results.get(name)!;
        assert.ok(plain.ok, plain.error);
        assert.ok(reported.ok, reported.error);
        assert.deepEqual(reported.userData, plain.userData, 'the processed user-data: the same parts');
        assert.deepEqual(reported.cloudConfig, plain.cloudConfig, "user-data's cloud-config");
        assert.deepEqual(withoutReporting(reported.merged), withoutReporting(plain.merged), 'the merged configuration');
        assert.deepEqual(
          reported.vendorCloudConfig,
          { ...(plain.vendorCloudConfig ?? {}), reporting: { vmseed: expectedHandler(ENDPOINT) } },
          "vendor-data's cloud-config: the VMI's own, and reporting",
        );
        assert.deepEqual(reported.merged.reporting, { vmseed: expectedHandler(ENDPOINT) });
        assert.equal(plain.merged.reporting, undefined);
        assert.equal(reported.vendorSchemaErrors, plain.vendorSchemaErrors, 'the part passes the schema check');
        assert.equal(seed.progressNotReported, undefined);
      });
    }

    test('user-data with vendor_data: {enabled: false} drops it with the rest of vendor-data', () => {
      const { plain, reported } = results.get('user-vendor-data-disabled')!;
      assert.ok(reported.ok, reported.error);
      assert.equal(reported.vendorCloudConfig, null);
      assert.equal(reported.merged.reporting, undefined);
      assert.deepEqual(withoutReporting(reported.merged), withoutReporting(plain.merged));
    });

    test('user-data with reporting: {vmseed: null} wins over it', () => {
      const { reported } = results.get('user-reporting-null')!;
      assert.ok(reported.ok, reported.error);
      assert.deepEqual(reported.merged.reporting, { vmseed: null });
    });
  });

interface Recorded {
  method: string;
  path: string;
  headers: IncomingHttpHeaders;
  body: Record<string, unknown>;
}

// Answers every request 200 and keeps it, in order.
async function recorder(): Promise<{ server: Server; base: string; requests: Recorded[] }> {
  const requests: Recorded[] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      requests.push({
        method: req.method!,
        path: req.url!,
        headers: req.headers,
        body: JSON.parse(Buffer.concat(chunks).toString('utf8')) as Record<string, unknown>,
      });
      res.writeHead(200, { 'content-type': 'text/plain' }).end('ok');
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { server, base: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`, requests };
}

// 25.1 says how long a module took ("ran successfully and took 0.001 seconds").
const timed = (d: unknown) => String(d).replace(/took [0-9.]+ seconds/, 'took <float> seconds');

// What a fixture keeps of a request: the token stays (FIXTURE_KEY, FIXTURE_UID);
// the port and the times do not.
function fixtureOf(r: Recorded, port: string): Recorded {
  const headers = { ...r.headers, host: r.headers.host?.replace(`:${port}`, ':<port>') };
  delete headers['content-length'];
  return { ...r, headers, body: { ...r.body, timestamp: '<float>', description: timed(r.body.description) } };
}

for (const rel of RELEASES) {
  describe(`cloud-init ${rel.name} posts its events where the rendered seed says`, () => {
    let rec: Awaited<ReturnType<typeof recorder>>;
    let tmp = '';
    before(async () => {
      rec = await recorder();
      tmp = mkdtempSync(join(tmpdir(), 'vmseed-progress-post-'));
    });
    after(async () => {
      await new Promise<void>((r) => rec.server.close(() => r()));
      rmSync(tmp, { recursive: true, force: true });
    });

    for (const fail of [false, true]) {
      const fixture = fail ? 'modules-final-fail' : 'modules-final-success';
      test(`${fixture}: POST <base>/<report token>/${REPORT_PATH_NAME}, one JSON event each`, async () => {
        rec.requests.length = 0;
        const token = reportToken(keyring, FIXTURE_UID);
        assert.equal(token, TOKEN.token, 'token.json says the token');
        const vmi = userVmi('reported', 'nocloud', '#cloud-config\nruncmd: [false]\n');
        const outcome = await renderSeed(vmi, new MemoryResolver({}), DEFAULT_RENDER_OPTIONS, {
          reportUrl: reportUrl(rec.base, token),
        });
        assert.ok(outcome.kind === 'seed');
        const dir = join(tmp, fixture);
        writeSeed(dir, outcome.seed);
        const out = await runCloudInit(
          {
            seeds: [{ id: fixture, dir, datasource: 'nocloud' }],
            report: { id: fixture, fail, singleProcess: rel.singleProcess },
          },
          await rel.pythonPath(),
        );
        assert.ok(out.seeds[0].ok, out.seeds[0].error);
        assert.equal(out.reported, true);
        const path = `/v1/${token}/${REPORT_PATH_NAME}`;
        for (const r of rec.requests) {
          assert.equal(r.method, 'POST');
          assert.equal(r.path, path);
          assert.match(String(r.headers['user-agent']), rel.agent);
          assert.equal(typeof r.body.timestamp, 'number');
          assert.equal(r.body.origin, 'cloudinit');
        }
        const seen = rec.requests.map((r) =>
          [r.body.event_type, r.body.name, r.body.result, timed(r.body.description)]
            .filter((x) => x !== undefined)
            .join(' '),
        );
        const expected = [
          // Published before a stage of its own process applies the configuration.
          ...(rel.singleProcess ? ['start modules-final running modules for final'] : []),
          'start modules-final/config-final-message running config-final-message with frequency always',
          `finish modules-final/config-final-message SUCCESS config-final-message ran successfully${rel.name === '25.1' ? ' and took <float> seconds' : ''}`,
          ...(fail
            ? [
                'start modules-final/config-scripts-user running config-scripts-user with frequency always',
                'finish modules-final/config-scripts-user FAIL running config-scripts-user with frequency always',
                'finish modules-final FAIL running modules for final',
              ]
            : ['finish modules-final SUCCESS running modules for final']),
        ];
        // The handler posts from its own thread, in queue order.
        assert.deepEqual(seen, expected);
        const port = new URL(rec.base).port;
        const file = join(FIXTURES, rel.name, `${fixture}.json`);
        const recorded = rec.requests.map((r) => fixtureOf(r, port));
        if (process.env.VMSEED_WRITE_FIXTURES === '1') {
          mkdirSync(dirname(file), { recursive: true });
          writeFileSync(file, `${JSON.stringify(recorded, null, 2)}\n`);
        }
        assert.deepEqual(recorded, JSON.parse(readFileSync(file, 'utf8')), `the requests are those of ${file}`);
      });
    }
  });
}
