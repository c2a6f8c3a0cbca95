// The admission webhook's warnings about a VMI's cloud-init data: each
// problem cloud-init's own schema finds in the user-data, vendor-data and
// network data of the vmseed annotation and of the VMI's cloud-init volume
// (the first cloudInitNoCloud or cloudInitConfigDrive, as KubeVirt takes
// it) becomes one AdmissionReview
// warning, which kubectl prints as `Warning: ...`. Never a refusal and
// never a change to the patch: a check only ever adds warnings, and one
// that fails or takes too long says so in one warning.
//
// Inline data (userData, userDataBase64, networkData, networkDataBase64) is
// the submitter's own spec, so messages quote its values as cloud-init does;
// Secret-backed data (secretRef / userDataSecretRef, networkDataSecretRef,
// read with the keys KubeVirt reads) is named by kinds only, never a value.
// The release is the VMI's `vmseed.io/cloud-init-version` annotation
// ('22.4', '25.1' or 'off'), else --cloud-init-version.
import { Buffer } from 'node:buffer';
import type { RefResolver, VmiObject } from '../../api/objects.ts';
import { decodeBase64Strict } from '../../cloudinit/base64.ts';
import { ANNOTATION, parseAnnotation, type AnnotationSpec } from '../../cloudinit/annotation/annotation.ts';
import { firstCloudInitVolume } from '../../cloudinit/kubevirt/volume-input.ts';
import { readObject, readObjectKey } from '../../cloudinit/refs/object-refs.ts';
import { VENDORDATA_DEFAULT_KEY } from '../../cloudinit/userdata/vendor-data.ts';
import { NETWORKDATA_SECRET_KEYS, USERDATA_SECRET_KEYS, readSecretKey } from '../../cloudinit/refs/secret-refs.ts';
import type { CiProfile } from '../../cloudinit/schema/ci-validator.ts';
import { checkSchemas, type SchemaCheckRequest, type SchemaReport } from '../../cloudinit/schema/check.ts';
import { CLOUD_INIT_RELEASES } from '../../cloudinit/schema/schema-store.ts';
import { CLOUD_INIT_VERSION_ANNOTATION, releaseChoice } from '../../cloudinit/schema/release-annotation.ts';

/** Warnings about problems in one answer; past it, one "N more problems" line. */
export const MAX_PROBLEM_WARNINGS = 20;
/** One warning's length in bytes (the API server truncates longer ones). */
export const MAX_WARNING_BYTES = 256;
/** All warnings of one answer, in bytes: the API server keeps 4 KiB of warnings per request, from all webhooks. */
export const MAX_WARNINGS_TOTAL_BYTES = 3 * 1024;
/** Documents at least this large are checked on a worker thread. */
export const WORKER_MIN_BYTES = 64 * 1024;

/** Runs checkSchemas, on a worker for a large document (RenderPool's run). */
export interface SchemaRunner {
  run(op: 'checkSchemas', args: [SchemaCheckRequest], bytes: number, signal?: AbortSignal): Promise<SchemaReport>;
}

/** How the webhook checks cloud-init data; absent from the server's options: no check. */
export interface SchemaWarningOptions {
  dir: string;
  // --cloud-init-version.
  release: CiProfile | 'off';
  // The releases whose schema files are there (schemaStore(dir).status()); others are not checked.
  available: ReadonlySet<CiProfile>;
  // Reads the VMI's Secrets; absent: Secret-backed data is not checked (said in one warning).
  secrets?: RefResolver;
  // Why there is no `secrets` (no API credentials), for that warning.
  secretsUnavailable?: string;
  // Absent: checked inline whatever the size.
  runner?: SchemaRunner;
  // The whole check, Secret reads included (default 2 s); past it, one "took too long" warning.
  timeoutMs?: number;
}

type Json = Record<string, unknown>;

function isObject(v: unknown): v is Json {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

// One document to check: its bytes, its label in the warnings, and whether
// messages may quote its values.
interface Doc {
  kind: 'user-data' | 'network-data' | 'vendor-data';
  label: string;
  bytes: Uint8Array;
  reveal: boolean;
}

/** A warning's (or Event's) text without control characters, cut to `max` UTF-8 bytes on a character boundary. */
export function cut(text: string, max: number): string {
  const clean = text.replace(/[\x00-\x1f\x7f]+/g, ' ').trim();
  if (Buffer.byteLength(clean) <= max) return clean;
  let out = '';
  let bytes = 0;
  for (const ch of clean) {
    const n = Buffer.byteLength(ch);
    if (bytes + n > max - 3) break;
    out += ch;
    bytes += n;
  }
  return `${out}...`;
}

/** Collects the answer's warnings under the count and size budgets. */
class Warnings {
  readonly #suffix: string;
  readonly #lines: string[] = [];
  #bytes = 0;
  #problems = 0;
  #more = 0;

  constructor(release: string) {
    this.#suffix = ` (cloud-init ${release})`;
  }

  // A problem, or a note (not checked, took too long); `problem` counts toward the 20.
  add(text: string, problem = true): void {
    if (problem && this.#problems >= MAX_PROBLEM_WARNINGS) {
      this.#more++;
      return;
    }
    const line = cut(text, MAX_WARNING_BYTES - Buffer.byteLength(this.#suffix)) + this.#suffix;
    // Room kept for the "more" line.
    if (this.#bytes + Buffer.byteLength(line) > MAX_WARNINGS_TOTAL_BYTES - 64) {
      this.#more++;
      return;
    }
    this.#lines.push(line);
    this.#bytes += Buffer.byteLength(line);
    if (problem) this.#problems++;
  }

  addMore(n: number): void {
    this.#more += n;
  }

  lines(): string[] {
    if (this.#more === 0) return [...this.#lines];
    const s = this.#more === 1 ? '' : 's';
    return [...this.#lines, `${this.#more} more problem${s} not listed${this.#suffix}`];
  }
}

function problemLine(doc: Doc, p: SchemaReport['problems'][number]): string {
  const where = p.part ? `${doc.label} ${p.part}` : doc.label;
  const path = p.path === '' ? '' : `${p.path}: `;
  if (p.severity === 'deprecation') {
    const msg = p.message.replace(/^\s*DEPRECATED:\s*/i, '').trim();
    return `${where}: ${path}deprecated: ${msg}`;
  }
  return `${where}: ${path}${p.message}`;
}

function inline(
  kind: Doc['kind'],
  raw: unknown,
  b64: unknown,
  b64Field: string,
  out: Warnings,
): Uint8Array | undefined {
  if (typeof raw === 'string' && raw !== '') return new Uint8Array(Buffer.from(raw, 'utf8'));
  if (typeof b64 === 'string' && b64 !== '') {
    const r = decodeBase64Strict(b64);
    if (r.ok) return r.bytes;
    out.add(`${kind}: not checked: ${b64Field} is not valid base64`, false);
  }
  return undefined;
}

// A Secret or ConfigMap read for a document; its failure is one "not checked" line.
async function readRef(
  label: string,
  o: SchemaWarningOptions,
  out: Warnings,
  read: (refs: RefResolver) => Promise<Uint8Array[]>,
): Promise<Uint8Array[] | undefined> {
  if (!o.secrets) {
    out.add(`${label}: not checked: ${o.secretsUnavailable ?? 'the webhook cannot read Secrets'}`, false);
    return undefined;
  }
  try {
    return await read(o.secrets);
  } catch (e) {
    out.add(`${label}: not checked: ${e instanceof Error ? e.message : String(e)}`, false);
    return undefined;
  }
}

// The user-data and network data of a cloudInitNoCloud/ConfigDrive source
// (a volume's, or the vmseed annotation's, which has the same fields), as
// KubeVirt takes them: plain text over base64, non-empty Secret content over
// inline data.
async function sourceDocuments(
  source: Json,
  datasource: 'nocloud' | 'configdrive',
  namespace: string,
  o: SchemaWarningOptions,
  out: Warnings,
): Promise<Doc[]> {
  const docs: Doc[] = [];
  const userRef = isObject(source.secretRef) ? 'secretRef' : 'userDataSecretRef';
  const kinds = [
    {
      kind: 'user-data' as const,
      raw: source.userData,
      b64: source.userDataBase64,
      b64Field: 'userDataBase64',
      ref: source[userRef],
      refField: userRef,
      keys: USERDATA_SECRET_KEYS,
    },
    {
      kind: 'network-data' as const,
      raw: source.networkData,
      b64: source.networkDataBase64,
      b64Field: 'networkDataBase64',
      ref: source.networkDataSecretRef,
      refField: 'networkDataSecretRef',
      keys: NETWORKDATA_SECRET_KEYS,
    },
  ];
  for (const k of kinds) {
    // ConfigDrive's network data is OpenStack's network_data.json: no cloud-init schema.
    if (k.kind === 'network-data' && datasource !== 'nocloud') continue;
    const bytes = inline(k.kind, k.raw, k.b64, k.b64Field, out);
    const name = isObject(k.ref) && typeof k.ref.name === 'string' && k.ref.name !== '' ? k.ref.name : undefined;
    if (name !== undefined) {
      const label = `${k.kind} (Secret ${namespace}/${name})`;
      const read = await readRef(label, o, out, async (refs) => [
        await readSecretKey(refs, namespace, name, k.keys, k.refField),
      ]);
      if (!read) continue;
      if (read[0].length > 0) {
        docs.push({ kind: k.kind, label, bytes: read[0], reveal: false });
        continue;
      }
    }
    if (bytes && bytes.length > 0) docs.push({ kind: k.kind, label: k.kind, bytes, reveal: true });
  }
  return docs;
}

// The documents of the vmseed annotation: its KubeVirt-named fields, then
// userDataFrom's keys and its vendor-data. A document's values are quoted
// only when it is the annotation's own text (the submitter's spec); what a
// Secret or ConfigMap holds is named by kinds only. An annotation that does
// not parse has no documents here: the agent reports it (ANNOTATION_INVALID).
async function annotationDocuments(text: string, namespace: string, o: SchemaWarningOptions, out: Warnings) {
  let spec: AnnotationSpec;
  try {
    spec = parseAnnotation(text);
  } catch {
    return [];
  }
  const docs = await sourceDocuments(spec.source as unknown as Json, spec.datasource, namespace, o, out);
  const { userDataFrom, vendorData, vendorDataFrom } = spec.extras;
  const kindName = (k: 'secret' | 'configmap'): string => (k === 'secret' ? 'Secret' : 'ConfigMap');
  if (userDataFrom) {
    const label = `user-data (${kindName(userDataFrom.kind)} ${namespace}/${userDataFrom.name})`;
    const field = `${ANNOTATION}.userDataFrom`;
    const entries = await readRef(label, o, out, async (refs) =>
      (await readObject(refs, namespace, userDataFrom, field)).map((e) => e.bytes),
    );
    for (const bytes of entries ?? []) {
      if (userDataFrom.encoding !== 'base64') {
        docs.push({ kind: 'user-data', label, bytes, reveal: false });
        continue;
      }
      const r = decodeBase64Strict(Buffer.from(bytes).toString('latin1'));
      if (r.ok) docs.push({ kind: 'user-data', label, bytes: r.bytes, reveal: false });
      else out.add(`${label}: not checked: not valid base64 (encoding: base64)`, false);
    }
  }
  if (vendorData)
    docs.push({
      kind: 'vendor-data',
      label: 'vendor-data',
      bytes: new Uint8Array(Buffer.from(vendorData)),
      reveal: true,
    });
  if (vendorDataFrom) {
    const label = `vendor-data (${kindName(vendorDataFrom.kind)} ${namespace}/${vendorDataFrom.name})`;
    const read = await readRef(label, o, out, async (refs) => [
      await readObjectKey(refs, namespace, vendorDataFrom, `${ANNOTATION}.vendorDataFrom`, VENDORDATA_DEFAULT_KEY),
    ]);
    if (read && read[0].length > 0) docs.push({ kind: 'vendor-data', label, bytes: read[0], reveal: false });
  }
  return docs;
}

// The VMI's documents: the vmseed annotation's (what vmseed seeds) and its
// first cloud-init volume's (what KubeVirt, or vmseed when it owns volumes,
// seeds); a VMI normally has one of the two.
async function documents(vmi: VmiObject, namespace: string, o: SchemaWarningOptions, out: Warnings): Promise<Doc[]> {
  const text = vmi.metadata?.annotations?.[ANNOTATION];
  const docs = typeof text === 'string' ? await annotationDocuments(text, namespace, o, out) : [];
  // Only well-formed volumes: the object is the API server's, not yet KubeVirt-admitted.
  const volumes = Array.isArray(vmi.spec?.volumes) ? vmi.spec.volumes.filter((v) => isObject(v)) : [];
  const volume = firstCloudInitVolume({ ...vmi, spec: { ...vmi.spec, volumes } });
  if (!volume || !isObject(volume.source)) return docs;
  return [...docs, ...(await sourceDocuments(volume.source, volume.datasource, namespace, o, out))];
}

// The release of a VMI: its annotation, else the default; undefined: not checked.
// Read as the agent reads it (release-annotation.ts), so both check the
// same release; the warning is the webhook's own, shorter line.
function releaseOf(annotations: Json, o: SchemaWarningOptions, out: { bad?: string }): CiProfile | undefined {
  const a = annotations[CLOUD_INIT_VERSION_ANNOTATION];
  const choice = releaseChoice(typeof a === 'string' ? a : undefined);
  if (choice.kind === 'off') return undefined;
  if (choice.kind === 'release') return choice.release;
  if (choice.kind === 'unknown')
    out.bad =
      `${CLOUD_INIT_VERSION_ANNOTATION}: ${JSON.stringify(String(a)).slice(0, 40)} is not one of ` +
      `${[...CLOUD_INIT_RELEASES, 'off'].join(', ')}`;
  return o.release === 'off' ? undefined : o.release;
}

async function check(
  vmi: VmiObject,
  namespace: string,
  release: CiProfile,
  o: SchemaWarningOptions,
  out: Warnings,
  signal: AbortSignal,
): Promise<void> {
  for (const doc of await documents(vmi, namespace, o, out)) {
    if (signal.aborted) return;
    const req: SchemaCheckRequest = {
      dir: o.dir,
      release,
      reveal: doc.reveal,
      ...(doc.kind === 'user-data'
        ? { userData: doc.bytes }
        : doc.kind === 'vendor-data'
          ? { vendorData: doc.bytes }
          : { networkConfig: doc.bytes }),
    };
    let report: SchemaReport;
    try {
      report = o.runner ? await o.runner.run('checkSchemas', [req], doc.bytes.length, signal) : checkSchemas(req);
    } catch (e) {
      if (signal.aborted) return;
      out.add(`${doc.label}: not checked: ${e instanceof Error ? e.message : String(e)}`, false);
      continue;
    }
    for (const p of report.problems) out.add(problemLine(doc, p));
    out.addMore(report.omitted);
    for (const u of report.unchecked) {
      // A template is rendered in the guest: nothing the submitter must hear about.
      if (u.code === 'SCHEMA_TEMPLATE') continue;
      const where = u.part ? `${doc.label} ${u.part}` : doc.label;
      out.add(`${where}: not checked: ${u.reason}`, false);
    }
  }
}

/**
 * The warnings for a VMI being created (empty when it has no cloud-init
 * data, or its release is off or not available). Never throws; answers
 * within the timeout (one "took too long" warning then).
 */
export async function schemaWarnings(vmi: unknown, namespace: string, o: SchemaWarningOptions): Promise<string[]> {
  if (!isObject(vmi) || !isObject(vmi.spec)) return [];
  const annotations = isObject(vmi.metadata) && isObject(vmi.metadata.annotations) ? vmi.metadata.annotations : {};
  const bad: { bad?: string } = {};
  const release = releaseOf(annotations, o, bad);
  const head: string[] = bad.bad ? [cut(bad.bad, MAX_WARNING_BYTES)] : [];
  if (release === undefined || !o.available.has(release)) return head;
  const out = new Warnings(release);
  const abort = new AbortController();
  let timer: NodeJS.Timeout | undefined;
  const timeoutMs = o.timeoutMs ?? 2_000;
  const late = new Promise<'late'>((resolve) => {
    timer = setTimeout(() => resolve('late'), timeoutMs);
  });
  try {
    const done = await Promise.race([
      check(vmi as unknown as VmiObject, namespace, release, o, out, abort.signal).then(
        () => 'done' as const,
        (e: unknown) => e as Error,
      ),
      late,
    ]);
    if (done === 'late') {
      abort.abort();
      return [...head, cut(`cloud-config not checked: took too long (cloud-init ${release})`, MAX_WARNING_BYTES)];
    }
    if (done instanceof Error)
      return [...head, cut(`cloud-config not checked: ${done.message} (cloud-init ${release})`, MAX_WARNING_BYTES)];
    return [...head, ...out.lines()];
  } finally {
    clearTimeout(timer);
  }
}
