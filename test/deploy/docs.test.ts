import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ROOT, findObject, loadYamlDocuments } from '../support/manifests.ts';
import { exportedMetricNames } from '../support/promql.ts';
import { grantsOf, type PolicyRule } from '../support/rbac.ts';
import { AGENT_FLAGS, docOf } from '../../src/config/flags.ts';
import { LIMITS } from '../../src/cloudinit/limits.ts';
import { parseYaml } from '../../src/cloudinit/yaml.ts';

// The operator documentation: the README (overview, KubeVirt, metrics,
// troubleshooting) and docs/operations.md (install details, alerts).
const docs = readFileSync(ROOT + 'README.md', 'utf8') + '\n' + readFileSync(ROOT + 'docs/operations.md', 'utf8');

function section(heading: string): string {
  const start = docs.indexOf(`\n${heading}\n`);
  assert.ok(start >= 0, `no section ${heading}`);
  const level = heading.split(' ')[0];
  const rest = docs.slice(start + heading.length + 2);
  // `# comment` lines inside fenced code blocks are not headings.
  const outsideCode = rest.replace(/```[\s\S]*?```/g, (block) => block.replace(/#/g, ' '));
  const end = outsideCode.search(new RegExp(`\\n#{1,${level.length}} `));
  return end < 0 ? rest : rest.slice(0, end);
}

function tableRows(text: string): string[][] {
  return text
    .split('\n')
    .filter((l) => l.startsWith('| `'))
    .map((l) =>
      l
        .slice(1, -1)
        .split(' | ')
        .map((c) => c.trim()),
    );
}

test('the metrics reference documents every metric of src/metrics/metrics.ts, with its type, labels and help', async () => {
  const exported = await exportedMetricNames({ processMetrics: false });
  const own = [...exported].filter(([name, info]) => !(info.type === 'histogram' && /_(bucket|sum|count)$/.test(name)));
  const rows = tableRows(section('### Metrics reference'));
  const documented = new Map(rows.map((r) => [r[0].replaceAll('`', ''), r]));
  for (const [name, info] of own) {
    const row = documented.get(name);
    assert.ok(row, `${name} is not in the README's metrics reference`);
    assert.equal(row[1], info.type, `${name}: type`);
    assert.equal(
      row[2],
      info.labels.length === 0 ? '—' : info.labels.map((l) => `\`${l}\``).join(', '),
      `${name}: labels`,
    );
    assert.equal(row[3], info.help, `${name}: help text`);
  }
  for (const name of documented.keys())
    assert.ok(exported.has(name), `docs list ${name}, which the agent does not export`);
});

test('the process metrics the docs name exist with the vmseed_ prefix', async () => {
  const exported = await exportedMetricNames({ processMetrics: true });
  const tail = section('### Metrics reference').split('| `vmseed_build_info`')[1];
  const named = [...tail.matchAll(/`(vmseed_[a-z_]+)`/g)].map((m) => m[1]);
  assert.ok(named.length >= 3);
  for (const name of named) assert.ok(exported.has(name), name);
});

test('the RBAC table in the docs is the ClusterRole', () => {
  const role = findObject(loadYamlDocuments('manifests/daemonset.yaml'), 'ClusterRole') as unknown as {
    rules: PolicyRule[];
  };
  const fromDocs = tableRows(section('## Install'))
    .filter((r) => r.length === 4 && /^`(""|[a-z.]+)`$/.test(r[0]))
    .flatMap(([group, resources, verbs]) => {
      const list = (cell: string) => [...cell.matchAll(/`([^`]*)`/g)].map((m) => m[1]);
      const g = group.replaceAll('`', '').replace('""', '');
      return list(resources).flatMap((resource) => list(verbs).map((verb) => `${g} ${resource} ${verb}`));
    });
  const fromRole = grantsOf(role.rules).map((g) => `${g.apiGroup} ${g.resource} ${g.verb}`);
  assert.deepEqual(fromDocs.sort(), fromRole.sort());
});

test('the documented DaemonSet numbers are the manifest numbers', () => {
  const ds = findObject(loadYamlDocuments('manifests/daemonset.yaml'), 'DaemonSet') as unknown as {
    spec: {
      updateStrategy: { rollingUpdate: { maxUnavailable: string } };
      template: {
        spec: {
          containers: {
            name: string;
            resources: { requests: Record<string, string>; limits: Record<string, string> };
            env: { name: string; value?: string }[];
          }[];
        };
      };
    };
  };
  const agent = ds.spec.template.spec.containers.find((c) => c.name === 'agent')!;
  const install = section('## Install');
  const { requests, limits } = agent.resources;
  assert.ok(install.includes(`requests \`${requests.cpu}\` / \`${requests.memory}\``));
  assert.ok(install.includes(`limits \`${limits.cpu}\` / \`${limits.memory}\``));
  assert.ok(install.includes(`\`maxUnavailable: ${ds.spec.updateStrategy.rollingUpdate.maxUnavailable}\``));
  const nodeOptions = agent.env.find((e) => e.name === 'NODE_OPTIONS')!.value!;
  assert.ok(install.includes(`NODE_OPTIONS=${nodeOptions}`));
  const dockerfile = readFileSync(ROOT + 'Dockerfile', 'utf8');
  const base = /^FROM (\S+)$/m.exec(dockerfile)![1];
  assert.ok(install.includes(`\`${base}\``), `docs name the base image ${base}`);
});

test('every alert in the PrometheusRule has a section, and no section is stale', () => {
  const [rule] = loadYamlDocuments('manifests/monitoring/prometheusrule.yaml') as unknown as {
    spec: { groups: { rules: { alert: string }[] }[] };
  }[];
  const alerts = rule.spec.groups.flatMap((g) => g.rules.map((r) => r.alert)).sort();
  const sections = [...docs.matchAll(/^#### Alert: (\S+)$/gm)].map((m) => m[1]).sort();
  assert.deepEqual(sections, alerts);
});

type Any = any;
const daemonSetObjects = () => loadYamlDocuments('manifests/daemonset.yaml');
const oneLine = (s: string) => s.replace(/\s+/g, ' ');

test("the priority class the docs describe is the manifest's, at kubevirt-cluster-critical's level", () => {
  const objects = daemonSetObjects();
  const pod = (findObject(objects, 'DaemonSet') as Any).spec.template.spec;
  const cls = findObject(objects, 'PriorityClass') as Any;
  const install = oneLine(section('## Install'));
  assert.ok(install.includes(`\`priorityClassName: ${pod.priorityClassName}\``), 'the class name');
  assert.ok(install.includes(`value \`${cls.value}\``), `the value ${cls.value}`);
  assert.ok(install.includes(`\`globalDefault: ${cls.globalDefault}\``));
  // KubeVirt's own class for its core components (virt-handler included) is
  // 10^9, the highest a user-defined class may have.
  assert.ok(install.includes('`kubevirt-cluster-critical`'));
  assert.equal(cls.value, 1_000_000_000);
});

test("the README's upgrade and uninstall sections agree with the manifests and name paths that exist", () => {
  const objects = daemonSetObjects();
  const ds = findObject(objects, 'DaemonSet') as Any;
  const { maxUnavailable, maxSurge } = ds.spec.updateStrategy.rollingUpdate;
  const upgrade = oneLine(section('### Upgrade'));
  assert.ok(upgrade.includes(`at most ${String(maxUnavailable).replace('%', ' %')} of the nodes`), upgrade);
  assert.ok(upgrade.includes(`\`maxSurge: ${maxSurge}\``), upgrade);
  const uninstall = section('### Uninstall');
  const seeds = (ds.spec.template.spec.volumes as Any[]).find((v) => v.name === 'seeds').hostPath.path;
  assert.ok(uninstall.includes(`\`${seeds}\``), `the seeds' hostPath ${seeds}`);
  // Every directory a kubectl -k of these sections and of the install names.
  const commands = [section('## Install into a cluster'), upgrade, uninstall].join('\n');
  const dirs = [...commands.matchAll(/kubectl (?:apply|delete) -k ([^\s`,]+)/g)].map((m) => m[1]);
  assert.ok(dirs.includes('manifests/monitoring') && dirs.includes('deploy/<variant>'), dirs.join(' '));
  for (const dir of dirs.filter((d) => d !== '.'))
    for (const d of dir === 'deploy/<variant>' ? ['deploy/kubevirt', 'deploy/libvirt', 'deploy/namespaced'] : [dir])
      assert.ok(existsSync(join(ROOT, d, 'kustomization.yaml')), `${d} is a kustomization`);
});

test('the quick start: npm ci && npm start is enough to try it, scripts/setup-host.sh is for the tests', () => {
  const quick = oneLine(section('## Quick start'));
  assert.ok(quick.includes('`npm ci && npm start` is enough'), quick);
  assert.match(quick, /bash scripts\/setup-host\.sh # Debian packages for the tests/);
  assert.ok(existsSync(join(ROOT, 'scripts/setup-host.sh')));
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { scripts: { start: string } };
  // Local mode: no cluster, no libvirt, no root.
  assert.equal(pkg.scripts.start, 'bin/vmseed agent --local examples');
  const why = section("### vmseed or KubeVirt's own `cloudInitNoCloud`?");
  const rows = why.split('\n').filter((l) => l.startsWith('| ') && !l.startsWith('| |') && !l.startsWith('|---'));
  assert.ok(rows.length >= 6, 'a row per difference');
  for (const r of rows) assert.equal(r.split(' | ').length, 3, r);
});

test("docs/operations.md says which label kube-prometheus-stack's Prometheus selects by default", () => {
  const operations = readFileSync(join(ROOT, 'docs/operations.md'), 'utf8');
  const monitoring = oneLine(operations.slice(operations.indexOf('\n## Monitoring\n')));
  assert.ok(monitoring.includes('by the label `release: <its Helm release name>` by default'), monitoring);
  for (const value of ['serviceMonitorSelectorNilUsesHelmValues', 'ruleSelectorNilUsesHelmValues'])
    assert.ok(monitoring.includes(value), value);
});

test('install comes before tuning: in the README and in docs/operations.md, before flags, limits and variants', () => {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
  const at = (text: string, heading: string) => {
    const i = text.indexOf(`\n${heading}\n`);
    assert.ok(i >= 0, heading);
    return i;
  };
  const install = at(readme, '## Install into a cluster');
  for (const later of ['## Command line', '## Limits on input', '## Running beside KubeVirt', '## Monitoring'])
    assert.ok(install < at(readme, later), `README: install before ${later}`);
  const operations = readFileSync(join(ROOT, 'docs/operations.md'), 'utf8');
  const headings = [...operations.matchAll(/^## .+$/gm)].map((m) => m[0]);
  assert.equal(headings[0], '## Install');
});

// docs/threat-model.md restates facts that live in code: where the agent
// writes in a launcher, which child processes it starts, how YAML aliases
// are treated. Each is checked against the code that decides it.
test('docs/threat-model.md: the launcher directory, child processes and YAML aliases are what the code does', () => {
  const threat = oneLine(readFileSync(join(ROOT, 'docs/threat-model.md'), 'utf8'));
  const publishDir = docOf(AGENT_FLAGS['publish-dir'].byPlatform!.kubevirt);
  assert.ok(publishDir.endsWith('/ephemeral-disks/vmseed'), publishDir);
  assert.ok(
    threat.includes(
      "writes only into its own `vmseed` directory in each launcher's `ephemeral-disks` emptyDir (`--publish-dir`)",
    ),
  );
  assert.ok(
    threat.includes('no child processes but one `flock` at start and, only with `--libvirt virsh`, `virsh`'),
    'child processes',
  );
  assert.ok(threat.includes('the default `--libvirt rpc`'));
  assert.match(docOf(AGENT_FLAGS.libvirt.byMode!.cluster), /^rpc\b/);
  assert.ok(
    threat.includes(
      `YAML aliases are bounded, not refused (user-data written by hand uses them): at most ${LIMITS.yamlAliases} per document, none recursive, and the document with its aliases expanded at most 4 × its own size or ${LIMITS.yamlExpandedBytes / 2 ** 20} MiB`,
    ),
    'YAML aliases',
  );
  // Bounded, not refused: user-data with a few aliases parses.
  assert.equal(parseYaml('base: &b {a: 1}\none: *b\ntwo: *b\n').ok, true);
});
