import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, normalize, relative } from 'node:path';
import { ROOT, findObject, loadYamlDocuments } from '../support/manifests.ts';
import { exportedMetricNames } from '../support/promql.ts';
import { grantsOf, type PolicyRule } from '../support/rbac.ts';
import { AGENT_FLAGS, docOf } from '../../src/config/flags.ts';
import { LIMITS } from '../../src/cloudinit/limits.ts';
import { parseYaml } from '../../src/cloudinit/yaml.ts';

// The operator documentation: the README (overview, quick start, install in
// brief), docs/install.md (image, install, upgrade, uninstall),
// docs/reference/metrics.md and docs/operations.md (install details, alerts).
const read = (file: string) => readFileSync(join(ROOT, file), 'utf8');
const DOCS = {
  readme: 'README.md',
  install: 'docs/install.md',
  metrics: 'docs/reference/metrics.md',
  operations: 'docs/operations.md',
} as const;

// A section of one file, by its heading, up to the next heading of its level
// or above.
function section(heading: string, file: string = DOCS.operations): string {
  const docs = read(file);
  const start = docs.indexOf(`\n${heading}\n`);
  assert.ok(start >= 0, `no section ${heading} in ${file}`);
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
  const rows = tableRows(section('## Metrics reference', DOCS.metrics));
  const documented = new Map(rows.map((r) => [r[0].replaceAll('`', ''), r]));
  // One row per metric: a metric in two rows would say two things.
  const names = rows.map((r) => r[0]);
  assert.deepEqual(
    names.filter((n, i) => names.indexOf(n) !== i),
    [],
    'metrics listed twice',
  );
  for (const [name, info] of own) {
    const row = documented.get(name);
    assert.ok(row, `${name} is not in docs/reference/metrics.md`);
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
  const tail = section('## Metrics reference', DOCS.metrics).split('| `vmseed_build_info`')[1];
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

test('every alert in the PrometheusRule has a runbook page, and no page is stale', () => {
  const [rule] = loadYamlDocuments('manifests/monitoring/prometheusrule.yaml') as unknown as {
    spec: { groups: { rules: { alert: string }[] }[] };
  }[];
  const alerts = rule.spec.groups.flatMap((g) => g.rules.map((r) => r.alert)).sort();
  // One page per alert (test/deploy/runbooks.test.ts checks their sections);
  // no runbook text left in the README or docs/operations.md.
  const pages = readdirSync(join(ROOT, 'docs/runbooks'))
    .filter((f) => f.endsWith('.md'))
    .map((f) => f.replace(/\.md$/, ''))
    .sort();
  assert.deepEqual(pages, alerts);
  const docs = [DOCS.readme, DOCS.operations].map(read).join('\n');
  assert.deepEqual([...docs.matchAll(/^#### Alert: (\S+)$/gm)], []);
});

type Any = any;
// Every kustomize variant: the directories of deploy/ but components/.
const VARIANTS = readdirSync(join(ROOT, 'deploy'), { withFileTypes: true })
  .filter((d) => d.isDirectory() && d.name !== 'components')
  .map((d) => d.name);
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

test("docs/install.md's upgrade and uninstall sections agree with the manifests and name paths that exist", () => {
  const objects = daemonSetObjects();
  const ds = findObject(objects, 'DaemonSet') as Any;
  const { maxUnavailable, maxSurge } = ds.spec.updateStrategy.rollingUpdate;
  const upgrade = oneLine(section('## Upgrade', DOCS.install));
  assert.ok(upgrade.includes(`at most ${String(maxUnavailable).replace('%', ' %')} of the nodes`), upgrade);
  assert.ok(upgrade.includes(`\`maxSurge: ${maxSurge}\``), upgrade);
  const uninstall = section('## Uninstall', DOCS.install);
  const seeds = (ds.spec.template.spec.volumes as Any[]).find((v) => v.name === 'seeds').hostPath.path;
  assert.ok(uninstall.includes(`\`${seeds}\``), `the seeds' hostPath ${seeds}`);
  // Every directory a kubectl -k of these sections and of the installs names.
  const commands = [
    section('## Install into a cluster', DOCS.readme),
    section('## Install into a cluster', DOCS.install),
    upgrade,
    uninstall,
  ].join('\n');
  const dirs = [...commands.matchAll(/kubectl (?:apply|delete) -k ([^\s`,]+)/g)].map((m) => m[1]);
  assert.ok(dirs.includes('manifests/monitoring') && dirs.includes('deploy/<variant>'), dirs.join(' '));
  for (const dir of dirs.filter((d) => d !== '.'))
    for (const d of dir === 'deploy/<variant>' ? VARIANTS.map((v) => `deploy/${v}`) : [dir])
      assert.ok(existsSync(join(ROOT, d, 'kustomization.yaml')), `${d} is a kustomization`);
});

test('the quick start: npm ci && npm start is enough to try it, scripts/setup-host.sh is for the tests', () => {
  const quick = oneLine(section('## Quick start', DOCS.readme));
  assert.ok(quick.includes('`npm ci && npm start` is enough'), quick);
  assert.match(quick, /bash scripts\/setup-host\.sh # Debian packages for the tests/);
  assert.ok(existsSync(join(ROOT, 'scripts/setup-host.sh')));
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { scripts: { start: string } };
  // Local mode: no cluster, no libvirt, no root.
  assert.equal(pkg.scripts.start, 'bin/vmseed agent --local examples');
  const why = section("### vmseed or KubeVirt's own `cloudInitNoCloud`?", DOCS.readme);
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

test('install comes first: the image before the apply, in the README and docs/install.md; first in docs/operations.md', () => {
  const at = (file: string, heading: string) => {
    const i = read(file).indexOf(`\n${heading}\n`);
    assert.ok(i >= 0, `${file}: ${heading}`);
    return i;
  };
  const install = at(DOCS.readme, '## Install into a cluster');
  for (const later of ['## First VM', '## When it does not work', '## Documentation'])
    assert.ok(install < at(DOCS.readme, later), `README: install before ${later}`);
  const order = [
    '## Requirements',
    '## The container image: build, push, point the manifests at it',
    '## Install into a cluster',
    '## Upgrade',
    '## Uninstall',
  ].map((h) => at(DOCS.install, h));
  assert.deepEqual(
    order,
    [...order].sort((a, b) => a - b),
    'docs/install.md: requirements, image, install, upgrade, uninstall',
  );
  // In the README's install, the image is built and pushed before anything is applied.
  const readmeInstall = section('## Install into a cluster', DOCS.readme);
  const push = readmeInstall.indexOf('podman push ');
  assert.ok(push >= 0 && push < readmeInstall.indexOf('kubectl apply'), 'README: push before apply');
  const headings = [...read(DOCS.operations).matchAll(/^## .+$/gm)].map((m) => m[0]);
  assert.equal(headings[0], '## Install');
});

// The README is the door: what vmseed is, a quick start, the install, a
// first VM, where to look, links. Everything else is in docs/.
test('README.md has at most 250 lines', () => {
  const lines = read(DOCS.readme).split('\n');
  if (lines.at(-1) === '') lines.pop();
  assert.ok(lines.length <= 250, `README.md has ${lines.length} lines`);
});

function markdownFiles(): string[] {
  const docs = readdirSync(join(ROOT, 'docs'), { recursive: true, encoding: 'utf8' })
    .filter((f) => f.endsWith('.md'))
    .map((f) => `docs/${f}`);
  return ['README.md', 'CHANGELOG.md', ...docs].sort();
}

// GitHub's heading anchors (github-slugger): lower case, punctuation other
// than `-` and `_` dropped, each space a `-`; a repeated slug gets -1, -2, ...
function anchorsOf(markdown: string): Set<string> {
  const outsideCode = markdown.replace(/^```[\s\S]*?^```/gm, '');
  const seen = new Map<string, number>();
  const anchors = new Set<string>();
  for (const m of outsideCode.matchAll(/^#{1,6} +(.+?) *#*$/gm)) {
    const text = m[1].replace(/\[([^\]]*)\]\([^)]*\)/g, '$1');
    const base = text
      .toLowerCase()
      .replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, '')
      .replace(/ /g, '-');
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    anchors.add(n === 0 ? base : `${base}-${n}`);
  }
  return anchors;
}

test('anchorsOf follows GitHub: the anchors other documents use', () => {
  const anchors = anchorsOf(
    '# x\n## The seed gate: cloud-init must see the seed at first boot\n## Namespaced RBAC (`deploy/namespaced`)\n' +
      '## Troubleshooting: "cloud-init did nothing"\n## A\n## A\n```\n# not a heading\n```\n',
  );
  assert.deepEqual(
    [...anchors],
    [
      'x',
      'the-seed-gate-cloud-init-must-see-the-seed-at-first-boot',
      'namespaced-rbac-deploynamespaced',
      'troubleshooting-cloud-init-did-nothing',
      'a',
      'a-1',
    ],
  );
});

test('every relative link in README.md, CHANGELOG.md and docs/ resolves, and so does its #anchor', () => {
  const broken: string[] = [];
  let checked = 0;
  for (const file of markdownFiles()) {
    const text = read(file)
      .replace(/^```[\s\S]*?^```/gm, '')
      .replace(/`[^`\n]*`/g, '');
    for (const m of text.matchAll(/\]\(([^)\s]+)(?: "[^"]*")?\)/g)) {
      const link = m[1];
      if (/^[a-z][a-z0-9+.-]*:/i.test(link)) continue; // https:, mailto:
      const [path, anchor] = link.split('#', 2);
      const target = path === '' ? file : normalize(join(dirname(file), path));
      checked++;
      if (relative(ROOT, join(ROOT, target)).startsWith('..') || !existsSync(join(ROOT, target))) {
        broken.push(`${file}: ${link} (no ${target})`);
        continue;
      }
      if (anchor !== undefined && target.endsWith('.md') && statSync(join(ROOT, target)).isFile()) {
        if (!anchorsOf(read(target)).has(anchor)) broken.push(`${file}: ${link} (no heading #${anchor} in ${target})`);
      }
    }
  }
  assert.deepEqual(broken, []);
  assert.ok(checked > 50, `${checked} links checked`);
});

// No doc points at an image nobody has built: the manifests' image name
// appears only as the name `kustomize edit set image` replaces, with a
// reference the same document built and pushed before it.
test('ghcr.io/vmseed/vmseed appears only where a doc sets it to the image it built and pushed first', () => {
  const IMAGE = 'ghcr.io/vmseed/vmseed';
  let named = 0;
  for (const file of markdownFiles()) {
    const text = read(file);
    const first = text.indexOf(IMAGE);
    if (first < 0) continue;
    named++;
    const pushed = [...text.matchAll(/^podman push (\S+)$/gm)];
    assert.ok(pushed.length > 0 && pushed[0].index < first, `${file}: names ${IMAGE} before pushing an image`);
    for (const m of text.matchAll(new RegExp(`kustomize edit set image ${IMAGE.replaceAll('.', '\\.')}=(\\S+)`, 'g'))) {
      const ref = m[1];
      assert.ok(
        pushed.some((p) => p[1] === ref && p.index < m.index),
        `${file}: sets ${ref}, which it did not push before`,
      );
    }
  }
  assert.ok(named >= 3, 'the README, docs/install.md and docs/operations.md show the step');
});

// Every list of the kustomize targets names all of them: manifests/, each
// directory of deploy/ and deploy/components/.
test("the install's lists of kustomize targets are complete: manifests/, every deploy/ variant, the components", () => {
  const variants = VARIANTS;
  assert.deepEqual(
    [...variants].sort(),
    ['imds', 'kubevirt', 'libvirt', 'namespaced', 'single-tenant', 'webhook'],
    'ls deploy',
  );
  const components = readdirSync(join(ROOT, 'deploy', 'components'));
  for (const file of [DOCS.readme, DOCS.install]) {
    const install = section('## Install into a cluster', file);
    const list = install.slice(install.indexOf('The kustomize targets'));
    const items = [...list.matchAll(/^- `(manifests\/|deploy\/[a-z/-]+)`/gm)].map((m) => m[1]);
    assert.deepEqual(
      [...items].sort(),
      ['manifests/', ...variants.map((v) => `deploy/${v}`), 'deploy/components/'].sort(),
      file,
    );
    for (const c of components) assert.ok(list.includes(`\`${c}\``), `${file}: component ${c}`);
  }
});

// What the install creates, as the README and docs/install.md list it: every
// kind of manifests/daemonset.yaml and cluster.yaml, and each ClusterRole's
// grants in a short form.
test("the install's object lists name the PriorityClass, and each role's grants are the manifests'", () => {
  const agentRole = findObject(daemonSetObjects(), 'ClusterRole') as unknown as { rules: PolicyRule[] };
  const clusterRole = findObject(loadYamlDocuments('manifests/cluster.yaml'), 'ClusterRole') as unknown as {
    rules: PolicyRule[];
  };
  const agentGrants = grantsOf(agentRole.rules).map((g) => `${g.resource} ${g.verb}`);
  assert.deepEqual(agentGrants.sort(), [
    'events create',
    'events patch',
    'pods list',
    'pods watch',
    'virtualmachineinstances list',
    'virtualmachineinstances patch',
    'virtualmachineinstances watch',
  ]);
  const clusterGrants = grantsOf(clusterRole.rules).map((g) => `${g.resource} ${g.verb}`);
  assert.deepEqual(clusterGrants.sort(), [
    'configmaps get',
    'configmaps watch',
    'events create',
    'secrets get',
    'secrets watch',
    'tokenreviews create',
    'virtualmachineinstances list',
    'virtualmachineinstances watch',
    'virtualmachineinstances/unpause update',
    'virtualmachines get',
  ]);
  for (const file of [DOCS.readme, DOCS.install]) {
    const install = oneLine(section('## Install into a cluster', file));
    assert.ok(install.includes('the PriorityClass `vmseed-node-critical`'), `${file}: the PriorityClass`);
    assert.ok(install.includes('(VMIs list/watch/patch, Pods list/watch, Events create/patch'), `${file}: agent RBAC`);
    assert.ok(
      install.includes(
        "the ClusterRole `vmseed-cluster` (TokenReviews create, VMIs list/watch, Secrets and ConfigMaps get/watch, VMIs' `unpause` update, Events create, VirtualMachines get)",
      ),
      `${file}: the cluster component's RBAC`,
    );
    assert.ok(install.includes('the Role `vmseed-cluster-cert`'), `${file}: the cluster component's Role`);
  }
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
