// What the admission webhook changes in a VMI being created, as JSON Patch
// operations (RFC 6902) against the object the API server sent. Pure: the
// serial comes from the caller.
//
//  - The seed gate, for VMIs in scope (the vmseed annotation, or KubeVirt
//    IMDS's opt-in): `spec.startStrategy: Paused` and
//    `vmseed.io/resume-after-seed: "true"`, so the domain waits for its seed
//    (disk attached, or served over HTTP) and the agent unpauses it. Not
//    when the VMI opts out (`vmseed.io/gate: "false"`), sets a start
//    strategy of its own, or sets the resume annotation to anything but
//    "true" (nobody would unpause it).
//  - The datasource serial (`spec.domain.firmware.serial`) with a fresh
//    random token, unless the owner set a serial that is not one of ours.
//    The token is the VMI's because it is in the VMI's spec: the node agent
//    serves a VMI's seed to the token its own serial carries
//    (src/datasource/identity.ts). Nothing in the request decides the token,
//    so an AdmissionReview sent by anyone yields a token that opens nothing.
//  - An adopted cloud-init volume (adopt.ts): the volume and its disk
//    removed, each behind a `test` of its name so a patch applied to another
//    shape fails instead of removing something else, and the record in
//    `vmseed.io/adopted`. Such a VMI is in scope like any vmseed VMI.
import { ANNOTATION } from '../../cloudinit/annotation/annotation.ts';
import { IMDS_ENABLED } from '../../cloudinit/annotation/imds-annotations.ts';
import { ADOPTED_ANNOTATION, adoptedText, type AdoptedRecord } from '../../cloudinit/kubevirt/adopted.ts';

// The agent's seed gate reads this one (src/agent/domain/seed-gate.ts).
export const RESUME_ANNOTATION = 'vmseed.io/resume-after-seed';
export const GATE_ANNOTATION = 'vmseed.io/gate';

export type PatchOperation =
  { op: 'add' | 'replace' | 'test'; path: string; value: unknown } | { op: 'remove'; path: string };

/**
 * Makes and recognises the datasource serials the webhook writes.
 */
export interface SerialMinter {
  // A serial with a fresh random token.
  serial(): string;
  // Whether a serial already on the VMI is one this webhook writes (so it
  // is replaced, not kept as the owner's): a copied manifest carries the
  // old VMI's serial, whose token must not open the new VMI.
  isOurs(serial: string): boolean;
}

export interface MutateOptions {
  // Absent: the serial is not written (--webhook-serial off).
  serials?: SerialMinter;
}

type Json = Record<string, unknown>;

function isObject(v: unknown): v is Json {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function stringMap(v: unknown): Record<string, string> {
  if (!isObject(v)) return {};
  const out: Record<string, string> = {};
  for (const [k, x] of Object.entries(v)) if (typeof x === 'string') out[k] = x;
  return out;
}

// JSON Pointer (RFC 6901) escaping of one path segment.
function pointer(segment: string): string {
  return segment.replaceAll('~', '~0').replaceAll('/', '~1');
}

// Whether the webhook acts on this VMI at all: the same test as the
// configuration's matchConditions, repeated here so a VMI outside them is
// never patched even when the configuration is edited wrongly.
export function inScope(annotations: Record<string, string>): boolean {
  return ANNOTATION in annotations || ADOPTED_ANNOTATION in annotations || annotations[IMDS_ENABLED] === 'true';
}

// In scope (a seed disk, or a seed served over HTTP only for KubeVirt
// IMDS's opt-in, which the agent unpauses once it serves it).
function wantsGate(spec: Json, annotations: Record<string, string>): boolean {
  if (annotations[GATE_ANNOTATION] === 'false') return false;
  if (spec.startStrategy !== undefined && spec.startStrategy !== null) return false;
  const resume = annotations[RESUME_ANNOTATION];
  return resume === undefined || resume === 'true';
}

// The patch for a VMI being created (with `adopted`: its cloud-init volume
// adopted); [] leaves it as it is.
export function mutateVmi(vmi: unknown, options: MutateOptions, adopted?: AdoptedRecord): PatchOperation[] {
  if (!isObject(vmi) || !isObject(vmi.metadata) || !isObject(vmi.spec)) return [];
  const meta = vmi.metadata;
  const spec = vmi.spec;
  const hasAnnotations = isObject(meta.annotations);
  const annotations = stringMap(meta.annotations);
  if (!inScope(annotations) && !adopted) return [];
  const ops: PatchOperation[] = [];
  const added: Record<string, string> = {};
  if (adopted) added[ADOPTED_ANNOTATION] = adoptedText(adopted);
  if (wantsGate(spec, annotations)) {
    ops.push({ op: 'add', path: '/spec/startStrategy', value: 'Paused' });
    if (annotations[RESUME_ANNOTATION] === undefined) added[RESUME_ANNOTATION] = 'true';
  }
  const serialOps = serialPatch(spec, options);
  // Annotations first: one `add` of the whole map when there is none.
  if (Object.keys(added).length > 0) {
    if (!hasAnnotations) ops.unshift({ op: 'add', path: '/metadata/annotations', value: added });
    else
      for (const [k, v] of Object.entries(added))
        ops.unshift({
          op: k in annotations ? 'replace' : 'add',
          path: `/metadata/annotations/${pointer(k)}`,
          value: v,
        });
  }
  return [...ops, ...serialOps, ...(adopted ? adoptionPatch(adopted) : [])];
}

// The volume's and the disk's removal, each guarded by its name.
function adoptionPatch(adopted: AdoptedRecord): PatchOperation[] {
  const name = adopted.volume.name;
  const ops: PatchOperation[] = [];
  if (adopted.disk && adopted.diskIndex !== undefined) {
    const disk = `/spec/domain/devices/disks/${adopted.diskIndex}`;
    ops.push({ op: 'test', path: `${disk}/name`, value: name }, { op: 'remove', path: disk });
  }
  const volume = `/spec/volumes/${adopted.volumeIndex}`;
  ops.push({ op: 'test', path: `${volume}/name`, value: name }, { op: 'remove', path: volume });
  return ops;
}

function serialPatch(spec: Json, options: MutateOptions): PatchOperation[] {
  const serials = options.serials;
  if (!serials || !isObject(spec.domain)) return [];
  const domain = spec.domain;
  const firmware = isObject(domain.firmware) ? domain.firmware : undefined;
  const current = firmware?.serial;
  if (typeof current === 'string' && current !== '' && !serials.isOurs(current)) return [];
  // A serial of ours already there (copied from an older VMI, or written at
  // an earlier invocation) is replaced: its token is not this VMI's.
  const serial = serials.serial();
  if (firmware === undefined) return [{ op: 'add', path: '/spec/domain/firmware', value: { serial } }];
  return [{ op: current === undefined ? 'add' : 'replace', path: '/spec/domain/firmware/serial', value: serial }];
}
