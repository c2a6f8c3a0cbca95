// The agent as a process with the webhook and the datasource on, and none of
// the files their Secrets would hold: it starts, seeds, and /readyz names
// what is missing; files that appear later are taken up without a restart.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir, rename, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { keyLine, randomKey } from '../../datasource/datasource-fixtures.ts';
import { isoFilesUnder, tempDir, waitFor } from '../../support/agent-harness.ts';
import { readyz, startCliAgent } from '../../support/agent-cli.ts';
import { certDir, fixtureReview, patchOf, post, testPki } from '../../support/webhook.ts';
import { CHALLENGE_PREFIX, newNonce } from '../../../src/redirect/challenge.ts';

const VMI = `apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: web
  namespace: default
  uid: 11111111-2222-3333-4444-555555555555
  annotations:
    vmseed.io/cloud-init: |
      userData: |
        #cloud-config
        hostname: web
spec:
  domain: {}
`;

const images = isoFilesUnder;

test('no datasource key and no webhook certificate: the agent seeds, /readyz says why, and both are taken up when they appear', async (t) => {
  const tmp = await tempDir('vmseed-webhook-agent-');
  const dir = tmp.path;
  const manifests = join(dir, 'vmis');
  const keys = join(dir, 'datasource');
  const tls = join(dir, 'webhook-tls');
  // The directories exist (empty Secret volumes), their files do not.
  await Promise.all([mkdir(manifests), mkdir(keys), mkdir(tls)]);
  await writeFile(join(manifests, 'web.yaml'), VMI);
  const agent = startCliAgent([
    '--local',
    manifests,
    '--state-dir',
    join(dir, 'seeds'),
    '--datasource-listen',
    '127.0.0.1:0',
    '--datasource-key-file',
    join(keys, 'keys'),
    '--webhook-listen',
    '127.0.0.1:0',
    '--webhook-cert-dir',
    tls,
  ]);
  // The agent is stopped before its directory goes.
  t.after(async () => {
    await agent.stop();
    await tmp.remove();
  });
  const url = await agent.url();
  await waitFor('the seed image', () => images(join(dir, 'seeds')).length === 1, 60_000);
  const notReady = await waitFor('/readyz naming the certificate', async () => {
    const r = await readyz(url);
    return r.status === 503 && r.body.includes('webhook certificate missing') ? r : undefined;
  });
  assert.match(notReady.body, new RegExp(`${tls}/tls.crt`));

  // The datasource answers the redirect challenge with one line per key: none yet.
  const dsPort = await waitFor('datasource port', () => {
    const m = /"port":(\d+),"prefix"/.exec(agent.output());
    return m ? Number(m[1]) : undefined;
  });
  const challenge = async () =>
    (await (await fetch(`http://127.0.0.1:${dsPort}${CHALLENGE_PREFIX}${newNonce()}`)).text()).trim();
  assert.equal(await challenge(), '');
  await writeFile(join(keys, 'keys.tmp'), `${keyLine(randomKey())}\n`);
  await rename(join(keys, 'keys.tmp'), join(keys, 'keys'));
  await waitFor('the key loaded', async () => (await challenge()).length === 43);

  const pki = await testPki('webhook');
  await certDir(pki, tls);
  await waitFor('/readyz 200 once the certificate is there', async () => (await readyz(url)).status === 200);
  const webhookPort = await waitFor('webhook port', () => {
    const m = /"port":(\d+),"path":"\/mutate-virtualmachineinstance"/.exec(agent.output());
    return m ? Number(m[1]) : undefined;
  });
  const answer = await post(webhookPort, pki.caCert, JSON.stringify(await fixtureReview('vmi-direct')));
  const paths = patchOf(answer)!.map((o) => o.path);
  assert.ok(paths.includes('/spec/startStrategy'), paths.join(' '));
  assert.ok(paths.includes('/spec/domain/firmware'), 'the serial is written once a key is loaded');
  assert.equal(await agent.stop(), 0);
  assert.doesNotMatch(agent.output(), /"level":(50|60)/, 'nothing logged as an error');
});
