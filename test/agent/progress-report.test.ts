// Whether a seed asks cloud-init to report its progress, decided in the
// agent: the report URL from the datasource keyring and base URL, bound to
// the VMI's UID; the reason shown on the status page when it is not asked
// (the operator's flag, the VMI's annotation, no datasource, no key).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { progressReportPlanner } from '../../src/agent/provisioning/report-plan.ts';
import type { VmiObject } from '../../src/api/objects.ts';
import { REPORT_PROGRESS_ANNOTATION, reportingCloudConfig } from '../../src/cloudinit/userdata/reporting-config.ts';
import { readIso } from '../../src/disk/iso9660-read.ts';
import { DatasourceKeyring } from '../../src/datasource/tokens.ts';
import { projectVmi } from '../../src/http/status-page.ts';
import { reportMessage, reportToken, reportUrl } from '../../src/datasource/reports/report-token.ts';
import { randomKey } from '../datasource/datasource-fixtures.ts';
import { fakeKubeAndDir, imageOf, startAgent, vmi, waitFor } from '../support/agent-harness.ts';

const BASE = 'http://169.254.169.254/v1';
const optedOut = (v: VmiObject): VmiObject => ({
  ...v,
  metadata: { ...v.metadata, annotations: { ...v.metadata.annotations, [REPORT_PROGRESS_ANNOTATION]: 'false' } },
});

test('the planner: the URL under the base URL with a token of the UID, or why not', () => {
  const keyring = new DatasourceKeyring([randomKey()]);
  const v = vmi('a');
  const plan = progressReportPlanner({ enabled: true, datasource: { keyring, baseUrl: `${BASE}/` } })(v, 'uid-a');
  assert.ok('url' in plan);
  assert.equal(plan.url, reportUrl(BASE, reportToken(keyring, 'uid-a')));
  const token = plan.url.split('/').at(-2)!;
  assert.ok(keyring.verify(token, reportMessage('uid-a')));
  assert.ok(!keyring.verify(token, reportMessage('uid-b')), "another VMI's UID does not verify");

  const reason = (o: Parameters<typeof progressReportPlanner>[0], x: VmiObject = v) => {
    const p = progressReportPlanner(o)(x, 'uid-a');
    assert.ok('reason' in p, JSON.stringify(p));
    return p.reason;
  };
  assert.match(reason({ enabled: false, datasource: { keyring, baseUrl: BASE } }), /--report-progress=false/);
  assert.match(reason({ enabled: true, datasource: { keyring, baseUrl: BASE } }, optedOut(v)), /opts out/);
  assert.match(reason({ enabled: true }), /--datasource-listen/);
  assert.match(
    reason({ enabled: true, datasource: { keyring: DatasourceKeyring.empty(), baseUrl: BASE } }),
    /no datasource key/,
  );
  // The operator's "off" holds whatever the annotation says (even a wrong one).
  const typo = { ...v, metadata: { ...v.metadata, annotations: { [REPORT_PROGRESS_ANNOTATION]: 'nope' } } };
  assert.match(reason({ enabled: false }, typo), /--report-progress=false/);
});

test(
  "agent: a seed's vendor-data carries the VMI's report URL; an opted-out VMI's has none, and its status says why",
  { timeout: 60_000 },
  async (t) => {
    const { fake, dir } = await fakeKubeAndDir(t);
    const keyring = new DatasourceKeyring([randomKey()]);
    const h = await startAgent(fake, {
      stateDir: dir.path,
      reportPlan: progressReportPlanner({ enabled: true, datasource: { keyring, baseUrl: BASE } }),
    });
    t.after(() => h.stop());
    const a = fake.applyVmi(vmi('a'));
    const b = fake.applyVmi(optedOut(vmi('b')));
    const vendorData = (v: VmiObject) => {
      const iso = readIso(readFileSync(imageOf(h.store, v)));
      const e = iso.entries.find((x) => x.path.replace(/^\//, '') === 'vendor-data');
      return e ? Buffer.from(iso.read(e.path)!).toString('utf8') : undefined;
    };
    await waitFor('images of a and b', () => existsSync(imageOf(h.store, a)) && existsSync(imageOf(h.store, b)));
    assert.equal(vendorData(a), reportingCloudConfig(reportUrl(BASE, reportToken(keyring, a.metadata.uid!))));
    assert.equal(vendorData(b), undefined);
    const status = (name: string) => h.agent.status.snapshot().vmis.find((r) => r.name === name);
    await waitFor('b ready', () => status('b')?.state === 'ready');
    assert.match(status('b')?.progressNotReported ?? '', /opts out/);
    assert.equal(projectVmi(status('b')!).progressNotReported, status('b')?.progressNotReported, 'in /status.json');
    assert.equal(status('a')?.progressNotReported, undefined);
  },
);
