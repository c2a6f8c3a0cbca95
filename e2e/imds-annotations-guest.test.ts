// KubeVirt IMDS users switching to vmseed without editing their VMs, end to
// end in network namespaces this test makes: `vmseed agent` (local mode,
// --datasource-imds-compat) runs in a "node" namespace with its datasource
// on the node's address, vmseed's DNAT of 169.254.169.254:80 in front of
// it; a VMI carries only IMDS's annotations and reports its pod's IP, as
// KubeVirt reports a masquerade interface; the busybox guest in the
// "launcher pod" namespace (tap + NAT) fetches IMDS's token-less URL
// `http://169.254.169.254/v1/` and gets IMDS's meta-data and the
// annotation's user-data. No seed image is written.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdir, mkdtemp, rename, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { execNft, RedirectKeeper } from '../src/redirect/keeper.ts';
import { bootBusyboxInPod, masqueradeBinding } from './support/masquerade.ts';
import { makePodNode } from '../test/support/netns.ts';
import { isoFilesUnder, waitFor } from '../test/support/agent-harness.ts';

const ROOT = new URL('../', import.meta.url).pathname;
const UD = '#cloud-config\nusers:\n  - name: admin\nruncmd: [echo from-imds-annotation]\n';

test(
  'IMDS-annotated VMI: the guest reads IMDS meta-data and user-data at http://169.254.169.254/v1/ through the node redirect',
  { timeout: 300_000 },
  async (t) => {
    const env = await makePodNode();
    const dir = await mkdtemp(path.join(tmpdir(), 'vmseed-imds-annotations-'));
    const cleanups: Array<() => Promise<unknown>> = [];
    t.after(async () => {
      for (const c of cleanups.reverse()) await c().catch(() => {});
      await env.remove();
      await rm(dir, { recursive: true, force: true });
    });
    await masqueradeBinding(env);

    const manifests = path.join(dir, 'manifests');
    const state = path.join(dir, 'seeds');
    await mkdir(manifests);
    const keyFile = path.join(dir, 'keys');
    await writeFile(keyFile, `${randomBytes(32).toString('base64')}\n`);
    // As a VM template's annotations land on its VMI; the pod network
    // interface reports the launcher pod's IP.
    const vmi = `apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: my-vm
  namespace: team-a
  uid: 0b7e2f5c-3d1a-4e58-9b1f-2a6c8d4e0f11
  annotations:
    imds.kubevirt.io/enabled: "true"
    imds.kubevirt.io/user-data: |
${UD.split('\n')
  .filter((l) => l !== '')
  .map((l) => `      ${l}`)
  .join('\n')}
spec:
  domain:
    firmware:
      serial: "ds=nocloud;s=http://169.254.169.254/v1/"
status:
  interfaces:
    - name: default
      ipAddress: ${env.podAddress}
`;
    await writeFile(path.join(manifests, 'vmi.yaml.partial'), vmi);
    await rename(path.join(manifests, 'vmi.yaml.partial'), path.join(manifests, 'vmi.yaml'));

    const agent = spawn(
      'ip',
      [
        'netns',
        'exec',
        env.node,
        process.execPath,
        path.join(ROOT, 'src/main.ts'),
        'agent',
        '--local',
        manifests,
        '--state-dir',
        state,
        '--listen',
        '127.0.0.1:0',
        '--datasource-listen',
        `${env.nodeAddress}:8081`,
        '--datasource-key-file',
        keyFile,
        '--datasource-imds-compat',
        '--log-level',
        'debug',
      ],
      { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let log = '';
    agent.stdout.on('data', (d) => (log += d));
    agent.stderr.on('data', (d) => (log += d));
    cleanups.push(async () => {
      if (agent.exitCode === null) agent.kill('SIGTERM');
    });
    await waitFor('datasource listening', () => /NoCloud HTTP datasource listening/.test(log), 20_000);
    await waitFor(
      'IMDS VMI ready',
      () => /SeedReady[^\n]*HTTP only|seed served over HTTP only/.test(log),
      20_000,
    ).catch((e: Error) => {
      throw new Error(`${e.message}\nagent log:\n${log.slice(-3000)}`);
    });

    const keeper = new RedirectKeeper({
      spec: {
        table: 'vmseed',
        to: { host: env.nodeAddress, port: 8081 },
        podInterfaces: ['veth*'],
        metadata: { address: '169.254.169.254', port: 80 },
      },
      runner: execNft({ prefix: env.inNode([]) }),
      logger: pino({ level: 'silent' }),
      // The pod is a launcher: the only sources redirected.
      launchers: async () => [env.podAddress],
    });
    await keeper.tick('start');
    assert.equal(keeper.inPlace, true);
    cleanups.push(() => keeper.stop());

    const r = await bootBusyboxInPod(
      env.pod,
      'http://169.254.169.254/v1/',
      ['meta-data', 'user-data', 'network-config'],
      180_000,
    );
    assert.deepEqual(JSON.parse(r.files.get('meta-data')!.toString()), {
      'instance-id': 'team-a-my-vm',
      'local-hostname': 'my-vm',
    });
    assert.equal(r.files.get('user-data')!.toString(), UD);
    assert.equal(r.files.get('network-config')!.length, 0, 'no network-config: DHCP, as with IMDS');
    assert.equal(isoFilesUnder(state).length > 0, false, 'no seed image');
  },
);
