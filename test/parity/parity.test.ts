// KubeVirt parity: KubeVirt's own cloud-init test cases (cases.ts) go
// through `vmseed build --vmi`; the image is read back with bsdtar and every
// file is compared with what KubeVirt's webhook and virt-launcher would do
// (kubevirt-model.ts). A case passes when vmseed does what KubeVirt does, or
// differs only in the documented ways its `differs` names
// (docs/kubevirt-differences.md). A last test prints the tally.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { dump, load } from 'js-yaml';
import { runCli } from '../support/cli.ts';
import { bsdtarExtract, tempDir } from '../disk/tools.ts';
import { CASES, type Difference, type ParityCase } from './cases.ts';
import type { VmiObject } from '../../src/api/objects.ts';
import { decideAdoption } from '../../src/cluster/webhook/adopt.ts';
import { mutateVmi, type PatchOperation } from '../../src/cluster/webhook/mutate.ts';
import { MemoryResolver } from '../../src/cloudinit/refs/memory-resolver.ts';
import { DEFAULT_RENDER_OPTIONS, renderSeed } from '../../src/cloudinit/render.ts';
import { serializeMetaData } from '../../src/cloudinit/seed-files.ts';
import {
  RANDOM_UUID,
  VM_RANDOM_UUID,
  calculateLegacyUUID,
  launcher,
  pinnedDevices,
  startVm,
  webhook,
} from './kubevirt-model.ts';

type Obj = Record<string, any>;

const tally = { cases: 0, identical: 0, documented: 0, failed: 0, adopted: 0, leftToKubevirt: 0, leftByDesign: 0 };

function asVm(c: ParityCase): Obj {
  return {
    apiVersion: 'kubevirt.io/v1',
    kind: 'VirtualMachine',
    metadata: { name: c.vmi.metadata.name, namespace: c.vmi.metadata.namespace },
    spec: { runStrategy: 'Always', template: { metadata: {}, spec: c.vmi.spec } },
  };
}

function manifests(c: ParityCase): string {
  const docs: Obj[] = [c.vm ? asVm(c) : c.vmi];
  for (const [name, data] of Object.entries(c.secrets ?? {})) {
    docs.push({
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name, namespace: c.vmi.metadata.namespace },
      data: Object.fromEntries(Object.entries(data).map(([k, v]) => [k, Buffer.from(v).toString('base64')])),
    });
  }
  return docs.map((d) => dump(d, { lineWidth: -1 })).join('---\n');
}

async function build(c: ParityCase, dir: string): Promise<{ code: number; err: string; files?: Map<string, Buffer> }> {
  const vmiFile = join(dir, 'vmi.yaml');
  writeFileSync(vmiFile, manifests(c));
  const out = join(dir, 'seed.iso');
  const r = await runCli(['build', '--vmi', vmiFile, '-o', out], dir);
  if (r.code !== 0) return { code: r.code, err: r.err };
  const into = join(dir, 'x');
  mkdirSync(into);
  return { code: 0, err: r.err, files: bsdtarExtract(out, into) };
}

const UUID_V5 = /^[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

// KubeVirt's meta-data with the documented differences applied.
function expectedMeta(kv: Obj, got: Obj, differs: Difference[], name: string): Obj {
  const e = structuredClone(kv);
  for (const k of ['instance-id', 'uuid']) {
    if (e[k] === VM_RANDOM_UUID) {
      assert.ok(
        differs.includes('vm-legacy-firmware-uuid'),
        `KubeVirt >= 1.6 stores a random ${k}; the case must name vm-legacy-firmware-uuid`,
      );
      // What KubeVirt's firmware controller gave VMs before 1.6.
      e[k] = calculateLegacyUUID(name);
    }
    if (e[k] === RANDOM_UUID) {
      assert.ok(
        differs.includes('stable-instance-id'),
        `KubeVirt draws a random ${k} here; the case must name stable-instance-id`,
      );
      assert.match(String(got[k]), UUID_V5, `${k} is not a UUIDv5`);
      e[k] = got[k];
    }
  }
  if (differs.includes('configdrive-instance-id')) {
    assert.equal(e.instance_id, `${kv.instance_id}`, 'KubeVirt writes <name>.<namespace>');
    e.instance_id = e.uuid;
  }
  return e;
}

function warningCodes(err: string): string[] {
  return [...err.matchAll(/^vmseed build: warning: ([A-Z_]+):/gm)].map((m) => m[1]).sort();
}

for (const c of CASES) {
  test(`parity: ${c.name} (${c.from})`, async (t) => {
    tally.cases++;
    const differs = c.differs ?? [];
    const tmp = tempDir('vmseed-parity-');
    t.after(tmp.cleanup);
    const r = await build(c, tmp.dir);
    try {
      const vmi = c.vm ? startVm(asVm(c)) : c.vmi;
      const causes = webhook(vmi);
      const onlyInlineLimit = causes.length > 0 && causes.every((x) => /exceeds 2048 byte limit/.test(x.message));
      if (causes.length > 0 && !onlyInlineLimit) {
        // KubeVirt's webhook rejects the VMI: vmseed refuses with the webhook's sentence.
        assert.equal(r.code, 2, `KubeVirt rejects (${causes[0].message}); vmseed built a seed`);
        assert.ok(
          causes.some((x) => r.err.includes(x.message)),
          `no webhook message in: ${r.err}\nexpected one of: ${causes.map((x) => x.message).join(' | ')}`,
        );
      } else {
        if (onlyInlineLimit)
          assert.ok(
            differs.includes('inline-limit'),
            'KubeVirt rejects over 2048 bytes; the case must name inline-limit',
          );
        const kv = launcher(vmi, c.secrets ?? {}, pinnedDevices(vmi));
        if (!kv.ok && differs.includes('secret-value-key')) {
          assert.equal(r.code, 0, r.err);
          assert.equal(r.files!.get('user-data')!.toString(), c.secrets!['cloudinit-secret'].value);
        } else if (!kv.ok) {
          // virt-launcher fails the VMI: no seed from vmseed either.
          assert.equal(r.code, 2, `KubeVirt fails (${kv.message}); vmseed built a seed`);
        } else {
          assert.equal(r.code, 0, r.err);
          const got = r.files!;
          assert.deepEqual([...got.keys()].sort(), Object.keys(kv.files).sort(), 'file list');
          for (const [path, bytes] of Object.entries(kv.files)) {
            if (path.endsWith('meta-data') || path.endsWith('meta_data.json')) {
              const gotMeta = JSON.parse(got.get(path)!.toString()) as Obj;
              const want = expectedMeta(kv.metaData, gotMeta, differs, vmi.metadata.name);
              if (differs.includes('device-needs-domain')) {
                // KubeVirt lists the device with the address libvirt assigns; vmseed cannot know it.
                assert.equal(gotMeta.devices, undefined);
              }
              assert.deepEqual(gotMeta, want, `${path}: ${JSON.stringify(gotMeta)}`);
            } else if (path.endsWith('network_data.json') && differs.includes('network-converted')) {
              const nd = JSON.parse(got.get(path)!.toString()) as Obj;
              assert.ok(Array.isArray(nd.links) && nd.links.length === 1, 'converted network_data.json has the link');
              assert.equal(nd.links[0].ethernet_mac_address, '52:54:00:12:34:56');
            } else if (path === 'network-config' && differs.includes('network-converted')) {
              // KubeVirt's bytes would be a mapping without "version" (init-local fails on it); vmseed's is v2.
              const v2 = load(got.get(path)!.toString()) as Obj;
              assert.equal(v2.version, 2);
              assert.equal(Object.values(v2.ethernets as Obj)[0].match.macaddress, '52:54:00:12:34:56');
            } else {
              assert.ok(
                got.get(path)!.equals(bytes),
                `${path} differs: ${JSON.stringify(got.get(path)!.toString())} vs KubeVirt ${JSON.stringify(bytes.toString())}`,
              );
            }
          }
        }
      }
      assert.deepEqual(warningCodes(r.err), [...(c.warnings ?? [])].sort(), `warnings: ${r.err}`);
      await adoptedParity(c, vmi, { built: r.code === 0, kubevirtRejects: causes.length > 0 });
      if (differs.length === 0) tally.identical++;
      else tally.documented++;
    } catch (e) {
      tally.failed++;
      throw e;
    }
  });
}

// The same case adopted by the webhook (src/cluster/webhook/adopt.ts): the
// seed the node agent renders from the adopted VMI has the very files of the
// VMI as submitted, checked above against KubeVirt's. What KubeVirt refuses
// or fails, or vmseed does not adopt, is left unchanged to KubeVirt.
async function adoptedParity(
  c: ParityCase,
  vmi: Obj,
  outcome: { built: boolean; kubevirtRejects: boolean },
): Promise<void> {
  if (!vmi.spec.volumes?.some((v: Obj) => v.cloudInitNoCloud || v.cloudInitConfigDrive)) return;
  const secrets = new MemoryResolver({
    secrets: Object.entries(c.secrets ?? {}).map(([name, data]) => ({
      metadata: { name, namespace: vmi.metadata.namespace },
      data: Object.fromEntries(Object.entries(data).map(([k, v]) => [k, Buffer.from(v).toString('base64')])),
    })),
  });
  const decision = await decideAdoption(vmi, 'annotation', { secrets });
  if (decision.kind !== 'adopt') {
    tally.leftToKubevirt++;
    // KubeVirt builds it and vmseed could: left for a reason of adoption's own.
    if (outcome.built && !outcome.kubevirtRejects) tally.leftByDesign++;
    if (process.env.VMSEED_PARITY_WHY)
      process.stdout.write(
        `# not adopted: ${c.name}: ${decision.kind === 'skipped' ? decision.reason : decision.kind}\n`,
      );
    return;
  }
  // KubeVirt's webhook must still refuse what it refuses (inline data over
  // its limit included), and what vmseed cannot build is never adopted.
  assert.ok(!outcome.kubevirtRejects, 'adopted a VMI KubeVirt refuses');
  assert.ok(outcome.built, 'adopted a VMI vmseed cannot build');
  const adopted = applyJsonPatch(vmi, mutateVmi(vmi, {}, decision.record));
  const files = async (v: Obj, kubevirtVolumes: 'own' | 'ignore') => {
    const out = await renderSeed(v as VmiObject, secrets, { ...DEFAULT_RENDER_OPTIONS, kubevirtVolumes });
    assert.equal(out.kind, 'seed');
    const seed = out.seed;
    return [seed.datasource, serializeMetaData(seed).map((f) => [f.path, Buffer.from(f.bytes).toString('hex')])];
  };
  assert.ok(!adopted.spec.volumes.some((v: Obj) => v.cloudInitNoCloud || v.cloudInitConfigDrive));
  assert.deepEqual(await files(adopted, 'ignore'), await files(vmi, 'own'), 'adopted seed files');
  tally.adopted++;
}

// RFC 6902 for the operations the webhook writes (the webhook tests apply
// them with Kubernetes' own JSON Patch; this keeps 80 cases in-process).
function applyJsonPatch(object: Obj, ops: PatchOperation[]): Obj {
  const out = structuredClone(object);
  for (const op of ops) {
    const path = op.path
      .split('/')
      .slice(1)
      .map((x) => x.replaceAll('~1', '/').replaceAll('~0', '~'));
    const last = path.pop()!;
    let at: any = out;
    for (const p of path) at = at[p];
    if (op.op === 'test') assert.deepEqual(at[last], op.value, `test ${op.path}`);
    else if (op.op === 'remove') {
      if (Array.isArray(at)) at.splice(Number(last), 1);
      else delete at[last];
    } else if (Array.isArray(at) && op.op === 'add') at.splice(last === '-' ? at.length : Number(last), 0, op.value);
    else at[last] = structuredClone(op.value);
  }
  return out;
}

test('parity suite: every documented difference is in the docs table', () => {
  const doc = readFileSync(new URL('../../docs/kubevirt-differences.md', import.meta.url), 'utf8');
  const used = new Set(CASES.flatMap((c) => c.differs ?? []));
  for (const d of used) assert.ok(doc.includes(`\`${d}\``), `docs/kubevirt-differences.md has no row for ${d}`);
});

after(() => {
  process.stdout.write(
    `# parity: ${tally.cases} KubeVirt cases, ${tally.identical} identical, ${tally.documented} with documented differences, ${tally.failed} failed\n` +
      `# parity through adoption: ${tally.adopted} adopted with the same seed files, ${tally.leftToKubevirt} left to KubeVirt (${tally.leftByDesign} of them seeded by KubeVirt, the rest refused or failed by it)\n`,
  );
});
