// deploy/imds rendered by the real `kubectl kustomize`: the kubevirt variant
// on the host network plus the `redirect` container, which alone holds a
// capability (NET_ADMIN); its flags, with the node address the kubelet
// substitutes, load through `vmseed redirect` and point the DNAT at the
// agent's datasource port; the agent answers IMDS's token-less serial.
import { before, test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { isDeepStrictEqual } from 'node:util';
import { ROOT, findObject, loadYamlDocuments, type KubeObject } from '../support/manifests.ts';
import { kustomize, objectId } from '../support/kustomize.ts';
import { runCli } from '../support/cli.ts';
import { loadConfig } from '../../src/config/config.ts';

type Any = any;

let objects: KubeObject[];
const base = ['daemonset.yaml', 'cluster.yaml', 'admission-policy.yaml'].flatMap((f) =>
  loadYamlDocuments(`manifests/${f}`),
);
const podOf = (o: KubeObject[]): Any => (findObject(o, 'DaemonSet', 'vmseed') as Any).spec.template.spec;

before(async () => {
  objects = await kustomize(join(ROOT, 'deploy', 'imds'));
});

test('only the DaemonSet and the Service differ; host network; the agent container is the base one plus --datasource-imds-compat and the redirect status URL', () => {
  const differs = objects
    .filter(
      (o) =>
        !isDeepStrictEqual(
          o,
          base.find((b) => objectId(b) === objectId(o)),
        ),
    )
    .map(objectId);
  assert.deepEqual(differs.sort(), ['DaemonSet/vmseed/vmseed', 'Service/vmseed/vmseed']);
  // The Service only gains the redirect container's metrics port, which the
  // ServiceMonitor's second endpoint scrapes.
  const service = objects.find((o) => objectId(o) === 'Service/vmseed/vmseed') as Any;
  const baseService = base.find((o) => objectId(o) === 'Service/vmseed/vmseed') as Any;
  assert.deepEqual(service.spec.ports, [
    ...baseService.spec.ports,
    { name: 'redirect-metrics', port: 8082, targetPort: 'redirect-http', protocol: 'TCP' },
  ]);
  const redirectPort = podOf(objects)
    .containers.find((c: Any) => c.name === 'redirect')
    .ports.find((p: Any) => p.name === 'redirect-http');
  assert.equal(redirectPort.containerPort, 8082);
  const pod = podOf(objects);
  const basePod = podOf(base);
  assert.equal(pod.hostNetwork, true);
  assert.equal(pod.dnsPolicy, 'ClusterFirstWithHostNet');
  assert.deepEqual(pod.securityContext, basePod.securityContext, 'the pod still runs as 107/107');
  const agent = pod.containers.find((c: Any) => c.name === 'agent');
  const baseAgent = basePod.containers.find((c: Any) => c.name === 'agent');
  // On the host network, the listeners bind the node's own address, not
  // every address of the node.
  const hostBound = (baseAgent.args as string[]).map((a) =>
    a === '--listen=0.0.0.0:8080'
      ? '--listen=$(HOST_IP):8080'
      : a === '--datasource-listen=0.0.0.0:8081'
        ? '--datasource-listen=$(HOST_IP):8081'
        : a,
  );
  assert.equal(hostBound.filter((a, i) => a !== baseAgent.args[i]).length, 2, 'both listeners found in the base');
  assert.deepEqual(agent.args, [
    ...hostBound,
    '--datasource-imds-compat',
    '--redirect-status-url=http://$(HOST_IP):8082/readyz',
    '--launcher-addresses-file=/run/vmseed/launchers/launcher-addresses',
  ]);
  assert.ok(
    !(agent.args as string[]).some((a) => /^--(listen|datasource-listen)=(0\.0\.0\.0|\[::\]|:)/.test(a)),
    'no wildcard listener on the host network',
  );
  assert.deepEqual(agent.env, [
    ...baseAgent.env,
    { name: 'HOST_IP', valueFrom: { fieldRef: { fieldPath: 'status.hostIP' } } },
  ]);
  // The launcher addresses' directory, shared with the redirect container.
  assert.deepEqual(agent.volumeMounts, [
    ...baseAgent.volumeMounts,
    { name: 'launchers', mountPath: '/run/vmseed/launchers' },
  ]);
  assert.deepEqual(pod.volumes.find((v: Any) => v.name === 'launchers').emptyDir, {
    medium: 'Memory',
    sizeLimit: '1Mi',
  });
  assert.deepEqual(
    { ...agent, args: undefined, env: undefined, volumeMounts: undefined },
    { ...baseAgent, args: undefined, env: undefined, volumeMounts: undefined },
    'nothing else changed for the agent: no capability',
  );
  assert.equal(
    loadConfig(
      (agent.args as string[]).map((a) => a.replaceAll('$(HOST_IP)', '192.0.2.10')),
      { NODE_NAME: 'node-a' },
      '/',
    )!.launcherAddressesFile,
    (pod.containers.find((c: Any) => c.name === 'redirect').args as string[])
      .find((a) => a.startsWith('--launchers-file='))!
      .slice('--launchers-file='.length),
    'the agent writes the file the redirect reads',
  );
  const args = (agent.args as string[]).map((a) => a.replaceAll('$(HOST_IP)', '192.0.2.10'));
  const config = loadConfig(args, { NODE_NAME: 'node-a' }, '/')!;
  assert.equal(config.datasource?.imdsCompat, true);
  // The agent polls the very port the redirect container's /readyz listens on.
  const r = pod.containers.find((c: Any) => c.name === 'redirect');
  const health = (r.args as string[])
    .find((a) => a.startsWith('--listen='))!
    .slice('--listen='.length)
    .replaceAll('$(HOST_IP)', '192.0.2.10');
  assert.equal(config.redirectStatusUrl, `http://${health}${r.readinessProbe.httpGet.path}`);
});

test('the redirect container: root with NET_ADMIN only, read-only, ready only while the rule is in place', () => {
  const pod = podOf(objects);
  assert.deepEqual(
    pod.containers.map((c: Any) => c.name),
    ['agent', 'redirect'],
  );
  const r = pod.containers.find((c: Any) => c.name === 'redirect');
  assert.deepEqual(r.command, ['vmseed', 'redirect']);
  assert.deepEqual(r.securityContext, {
    runAsUser: 0,
    runAsGroup: 107,
    runAsNonRoot: false,
    allowPrivilegeEscalation: false,
    readOnlyRootFilesystem: true,
    capabilities: { drop: ['ALL'], add: ['NET_ADMIN'] },
  });
  assert.equal(r.readinessProbe.httpGet.path, '/readyz');
  assert.equal(r.env.find((e: Any) => e.name === 'HOST_IP').valueFrom.fieldRef.fieldPath, 'status.hostIP');
  // Only the node's datasource key (the agent's hostPath volume), read-only,
  // which its readiness checks the DNAT target's challenge answer with, and
  // the agent's launcher addresses, read-only; the key read through group
  // 107 (the agent writes it 0640), with no capability over file modes.
  assert.deepEqual(r.volumeMounts, [
    { name: 'datasource-key', mountPath: '/etc/vmseed/datasource', readOnly: true },
    { name: 'launchers', mountPath: '/run/vmseed/launchers', readOnly: true },
  ]);
  const keyVolume = pod.volumes.find((v: Any) => v.name === 'datasource-key');
  assert.deepEqual(keyVolume.hostPath, { path: '/var/lib/vmseed/keys', type: 'DirectoryOrCreate' });
  assert.ok(r.args.includes('--datasource-key-file=/etc/vmseed/datasource/keys'));
});

test("the redirect's args (with the node address substituted) load in vmseed redirect and DNAT to the agent's datasource port", async () => {
  const pod = podOf(objects);
  const r = pod.containers.find((c: Any) => c.name === 'redirect');
  const agent = pod.containers.find((c: Any) => c.name === 'agent');
  const args = (r.args as string[]).map((a) => a.replaceAll('$(HOST_IP)', '192.0.2.10'));
  const out = await runCli(['redirect', ...args, '--print'], process.cwd());
  assert.equal(out.code, 0, out.err);
  const port = /^--datasource-listen=.*:(\d+)$/.exec(
    agent.args.find((a: string) => a.startsWith('--datasource-listen=')),
  )![1];
  assert.match(out.out.toString(), new RegExp(`dnat to 192\\.0\\.2\\.10:${port} `));
  assert.match(
    out.out.toString(),
    /iifname \{ "veth\*", "cali\*", "lxc\*", "cni0", "cbr0" \} ip saddr @launchers ip daddr 169\.254\.169\.254 tcp dport 80/,
  );
  const health = /^--listen=\$\(HOST_IP\):(\d+)$/.exec(r.args.find((a: string) => a.startsWith('--listen=')))![1];
  assert.equal(String(r.ports[0].containerPort), health);
});
