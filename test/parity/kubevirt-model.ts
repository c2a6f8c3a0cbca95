// What KubeVirt does with a VMI's cloud-init volume, written from KubeVirt's
// Go code (kubevirt/kubevirt, main branch as of 2026-08) for the parity suite.
// It shares no code with vmseed: expected seeds come from here (and from the
// literal values in KubeVirt's tests), never from vmseed's output.
//
// - webhook(): pkg/virt-api/webhooks/validating-webhook/admitters/
//   vmi-create-admitter.go, validateVolumes (cloud-init part, source count)
//   validateAccessCredentials and validateHostNameNotConformingToDNSLabelRules
//   (apimachinery's IsDNS1123Label). Returns every cause, as the webhook does.
// - launcher(): pkg/cloud-init/cloud-init.go ReadCloudInitVolumeDataSource,
//   resolveNoCloudSecrets / resolveConfigDriveSecrets (the Secret is mounted
//   one file per key; readFirstFoundFileFromDir), resolveSSHPublicKeys,
//   readRawOrBase64Data, readCloudInitData, GenerateLocalData (files), the
//   NoCloudMetadata / ConfigDriveMetadata structs, pkg/util/net/dns
//   SanitizeHostname, and virt-launcher's buildDevicesMetadata for interfaces
//   whose guest address the spec pins (pciAddress).

import { createHash } from 'node:crypto';

export type Secrets = Record<string, Record<string, string>>;

export interface Cause {
  field: string;
  message: string;
}

// The instance-id KubeVirt draws with uuid.NewString() on every launch when
// the VMI has no firmware section (cloudInitUUIDFromVMI).
export const RANDOM_UUID = '<uuid.NewString()>';

// The firmware UUID KubeVirt >= 1.6 stores in a new VirtualMachine
// (pkg/virt-api/webhooks/mutating-webhook/mutators/vm-mutator.go
// setFirmwareDefaultsIfEmpty: uuid.New()).
export const VM_RANDOM_UUID = '<VM mutator uuid.New()>';

type Obj = Record<string, any>;

// pkg/virt-controller/watch/vm/firmware.go CalculateLegacyUUID:
// uuid.NewSHA1(6a1a24a1-4061-4607-8bf4-a3963d0c5895, name) (RFC 4122 v5).
export function calculateLegacyUUID(name: string): string {
  const ns = Buffer.from('6a1a24a140614607' + '8bf4a3963d0c5895', 'hex');
  const h = createHash('sha1').update(ns).update(name).digest().subarray(0, 16);
  h[6] = (h[6] & 0x0f) | 0x50;
  h[8] = (h[8] & 0x3f) | 0x80;
  const x = h.toString('hex');
  return `${x.slice(0, 8)}-${x.slice(8, 12)}-${x.slice(12, 16)}-${x.slice(16, 20)}-${x.slice(20)}`;
}

// A VirtualMachine created on KubeVirt >= 1.6 and started: the VMI takes the
// template, the VM's name and namespace, and the firmware UUID the mutating
// webhook stored at creation.
export function startVm(vm: Obj): Obj {
  const spec = structuredClone(vm.spec.template.spec);
  spec.domain.firmware ??= {};
  spec.domain.firmware.uuid ||= VM_RANDOM_UUID;
  return {
    apiVersion: vm.apiVersion,
    kind: 'VirtualMachineInstance',
    metadata: { ...(vm.spec.template.metadata ?? {}), name: vm.metadata.name, namespace: vm.metadata.namespace },
    spec,
  };
}

const present = (v: unknown): boolean => v !== undefined && v !== null;

// Go's base64.StdEncoding.DecodeString: padding required, \r and \n skipped.
function goBase64(s: string): { ok: true; bytes: Buffer } | { ok: false; message: string } {
  const clean = s.replace(/[\r\n]/g, '');
  for (let i = 0; i < clean.length; i++) {
    if (!/[A-Za-z0-9+/=]/.test(clean[i])) return { ok: false, message: `illegal base64 data at input byte ${i}` };
  }
  if (clean.length % 4 !== 0 || !/^[A-Za-z0-9+/]*={0,2}$/.test(clean)) {
    return { ok: false, message: `illegal base64 data at input byte ${clean.length}` };
  }
  return { ok: true, bytes: Buffer.from(clean, 'base64') };
}

export function webhook(vmi: Obj): Cause[] {
  const causes: Cause[] = [];
  const volumes: Obj[] = vmi.spec?.volumes ?? [];
  const sourceKeys = [
    'persistentVolumeClaim',
    'sysprep',
    'cloudInitNoCloud',
    'cloudInitConfigDrive',
    'containerDisk',
    'ephemeral',
    'emptyDisk',
    'hostDisk',
    'dataVolume',
    'configMap',
    'secret',
    'downwardAPI',
    'serviceAccount',
    'downwardMetrics',
    'memoryDump',
    'containerPath',
  ];
  volumes.forEach((volume, idx) => {
    const f = `spec.volumes[${idx}]`;
    const count = sourceKeys.filter((k) => present(volume[k])).length;
    if (count !== 1) causes.push({ field: f, message: `${f} must have exactly one source type set` });
    if (!present(volume.cloudInitNoCloud) && !present(volume.cloudInitConfigDrive)) return;
    const dst = present(volume.cloudInitNoCloud) ? 'cloudInitNoCloud' : 'cloudInitConfigDrive';
    const src: Obj = volume[dst];
    const base = `${f}.${dst}`;
    let userLen = 0;
    let userCount = 0;
    let netLen = 0;
    let netCount = 0;
    if (src.secretRef && src.secretRef.name) userCount++;
    if (src.userDataBase64) {
      userCount++;
      const d = goBase64(src.userDataBase64);
      if (!d.ok)
        causes.push({
          field: `${base}.userDataBase64`,
          message: `${base}.userDataBase64.${dst}.userDataBase64 is not a valid base64 value.`,
        });
      userLen = d.ok ? d.bytes.length : 0;
    }
    if (src.userData) {
      userCount++;
      userLen = Buffer.byteLength(src.userData);
    }
    if (userCount > 1) causes.push({ field: base, message: `${base} must have only one userdatasource set.` });
    if (userLen > 2048)
      causes.push({
        field: base,
        message: `${base} userdata exceeds 2048 byte limit. Should use UserDataSecretRef for larger data.`,
      });
    if (src.networkDataSecretRef && src.networkDataSecretRef.name) netCount++;
    if (src.networkDataBase64) {
      netCount++;
      const d = goBase64(src.networkDataBase64);
      if (!d.ok)
        causes.push({
          field: `${base}.networkDataBase64`,
          message: `${base}.networkDataBase64.${dst}.networkDataBase64 is not a valid base64 value.`,
        });
      netLen = d.ok ? d.bytes.length : 0;
    }
    if (src.networkData) {
      netCount++;
      netLen = Buffer.byteLength(src.networkData);
    }
    if (netCount > 1) causes.push({ field: base, message: `${base} must have only one networkdata source set.` });
    if (netLen > 2048)
      causes.push({
        field: base,
        message: `${base} networkdata exceeds 2048 byte limit. Should use NetworkDataSecretRef for larger data.`,
      });
    if (userCount === 0 && netCount === 0) {
      causes.push({
        field: base,
        message: `${base} must have at least one userdatasource or one networkdatasource set.`,
      });
    }
  });
  const hasNoCloud = volumes.some((v) => present(v.cloudInitNoCloud));
  const hasConfigDrive = volumes.some((v) => present(v.cloudInitConfigDrive));
  ((vmi.spec?.accessCredentials ?? []) as Obj[]).forEach((cred, idx) => {
    const f = `spec.accessCredentials[${idx}]`;
    let count = 0;
    if (present(cred.sshPublicKey)) {
      count++;
      const ssh = cred.sshPublicKey;
      const pm = ssh.propagationMethod ?? {};
      let methods = 0;
      if (present(pm.noCloud)) {
        methods++;
        if (!hasNoCloud)
          causes.push({
            field: `${f}.sshPublicKey.propagationMethod`,
            message: `${f} requires a noCloud volume to exist when the noCloud propagationMethod is in use.`,
          });
      }
      if (present(pm.configDrive)) {
        methods++;
        if (!hasConfigDrive)
          causes.push({
            field: `${f}.sshPublicKey.propagationMethod`,
            message: `${f} requires a configDrive volume to exist when the configDrive propagationMethod is in use.`,
          });
      }
      if (present(pm.qemuGuestAgent)) {
        if (!(pm.qemuGuestAgent.users?.length > 0)) {
          causes.push({
            field: `${f}.sshPublicKey.propagationMethod.qemuGuestAgent.users`,
            message: `${f} requires at least one user to be present in the users list`,
          });
        }
        methods++;
      }
      if (!present(ssh.source?.secret))
        causes.push({ field: `${f}.sshPublicKey.source`, message: `${f} must have exactly one source set` });
      if (methods !== 1)
        causes.push({
          field: `${f}.sshPublicKey.propagationMethod`,
          message: `${f} must have exactly one propagationMethod set`,
        });
    }
    if (present(cred.userPassword)) {
      count++;
      if (!present(cred.userPassword.source?.secret))
        causes.push({ field: `${f}.userPassword.source`, message: `${f} must have exactly one source set` });
      if (!present(cred.userPassword.propagationMethod?.qemuGuestAgent)) {
        causes.push({
          field: `${f}.userPassword.propagationMethod`,
          message: `${f} must have exactly one propagationMethod set`,
        });
      }
    }
    if (count !== 1) causes.push({ field: f, message: `${f} must have exactly one access credential type set` });
  });
  const hostname = vmi.spec?.hostname;
  if (typeof hostname === 'string' && hostname !== '') {
    const errs = isDns1123Label(hostname);
    if (errs.length > 0) {
      causes.push({
        field: 'spec.hostname',
        message: `spec.hostname does not conform to the kubernetes DNS_LABEL rules : ${errs.join(', ')}`,
      });
    }
  }
  return causes;
}

// k8s.io/apimachinery/pkg/util/validation/validation.go: IsDNS1123Label,
// MaxLenError, RegexError (examples joined by " or ", each followed by ", ").
function isDns1123Label(value: string): string[] {
  const label = '[a-z0-9]([-a-z0-9]*[a-z0-9])?';
  const errs: string[] = [];
  if (Buffer.byteLength(value) > 63) errs.push('must be no more than 63 characters');
  if (!new RegExp(`^${label}$`).test(value)) {
    if (new RegExp(`^${label}(\\.${label})*$`).test(value)) errs.push('must not contain dots');
    else {
      let msg =
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
      msg += ' (e.g. ';
      ['my-name', '123-abc'].forEach((ex, i) => {
        if (i > 0) msg += ' or ';
        msg += `'${ex}', `;
      });
      errs.push(`${msg}regex used for validation is '${label}')`);
    }
  }
  return errs;
}

export type LauncherResult =
  { ok: true; files: Record<string, Buffer>; metaData: Obj } | { ok: false; message: string };

function sanitizeHostname(vmi: Obj): string {
  let h = String(vmi.metadata.name).split('.')[0];
  if (Buffer.byteLength(h) > 63) h = Buffer.from(h).subarray(0, 63).toString();
  if (vmi.spec?.hostname) h = vmi.spec.hostname;
  return h;
}

// One mounted file per Secret key: os.ReadFile fails when the key is absent.
function readFirstFound(
  secret: Record<string, string> | undefined,
  keys: string[],
): { ok: true; data: string } | { ok: false } {
  for (const k of keys) if (secret && Object.hasOwn(secret, k)) return { ok: true, data: secret[k] };
  return { ok: false };
}

function sshKeys(vmi: Obj, secrets: Secrets, method: 'noCloud' | 'configDrive'): Record<string, string> {
  const keys: Record<string, string> = {};
  let n = 0;
  for (const cred of (vmi.spec?.accessCredentials ?? []) as Obj[]) {
    if (!cred.sshPublicKey || !present(cred.sshPublicKey.propagationMethod?.[method])) continue;
    const name = cred.sshPublicKey.source?.secret?.secretName;
    if (!name) continue;
    const secret = secrets[name] ?? {};
    // os.ReadDir sorts by file name.
    for (const file of Object.keys(secret).sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)))) {
      if (file.startsWith('..') || secret[file] === '') continue;
      keys[String(n++)] = secret[file];
    }
  }
  return keys;
}

export function launcher(vmi: Obj, secrets: Secrets, devices: Obj[] = []): LauncherResult {
  const annotations = vmi.metadata.annotations ?? {};
  const instancetype =
    annotations['kubevirt.io/cluster-instancetype-name'] || annotations['kubevirt.io/instancetype-name'] || '';
  const hostname = sanitizeHostname(vmi);
  const fw = vmi.spec?.domain?.firmware;
  const uuid = fw ? String(fw.uuid ?? '') : RANDOM_UUID;
  for (const volume of (vmi.spec?.volumes ?? []) as Obj[]) {
    const kind = present(volume.cloudInitNoCloud)
      ? 'cloudInitNoCloud'
      : present(volume.cloudInitConfigDrive)
        ? 'cloudInitConfigDrive'
        : undefined;
    if (!kind) continue;
    const src: Obj = { ...volume[kind] };
    const keys = sshKeys(vmi, secrets, kind === 'cloudInitNoCloud' ? 'noCloud' : 'configDrive');
    // resolve*Secrets: the volume's Secret is mounted under the volume name.
    if (src.secretRef || src.networkDataSecretRef) {
      let userErr = false;
      let netErr = false;
      let userData = '';
      let networkData = '';
      if (src.secretRef) {
        const r = readFirstFound(secrets[src.secretRef.name], ['userdata', 'userData']);
        if (r.ok) userData = r.data;
        else userErr = true;
      }
      if (src.networkDataSecretRef) {
        const r = readFirstFound(secrets[src.networkDataSecretRef.name], ['networkdata', 'networkData']);
        if (r.ok) networkData = r.data;
        else netErr = true;
      }
      if (userErr && netErr) return { ok: false, message: `no cloud-init data-source found at volume: ${volume.name}` };
      if (userData !== '') src.userData = userData;
      if (networkData !== '') src.networkData = networkData;
    }
    const raw = (
      plain: string | undefined,
      b64: string | undefined,
    ): { ok: true; v: Buffer } | { ok: false; message: string } => {
      if (plain) return { ok: true, v: Buffer.from(plain) };
      if (b64) {
        const d = goBase64(b64);
        return d.ok ? { ok: true, v: d.bytes } : { ok: false, message: d.message };
      }
      return { ok: true, v: Buffer.alloc(0) };
    };
    const u = raw(src.userData, src.userDataBase64);
    if (!u.ok) return { ok: false, message: u.message };
    const nw = raw(src.networkData, src.networkDataBase64);
    if (!nw.ok) return { ok: false, message: nw.message };
    if (u.v.length === 0 && nw.v.length === 0) {
      return {
        ok: false,
        message: 'userDataBase64, userData, networkDataBase64 or networkData is required for a cloud-init data source',
      };
    }
    const hasKeys = Object.keys(keys).length > 0;
    if (kind === 'cloudInitNoCloud') {
      const md: Obj = {
        ...(instancetype ? { 'instance-type': instancetype } : {}),
        'instance-id': uuid,
        ...(hostname ? { 'local-hostname': hostname } : {}),
        ...(hasKeys ? { 'public-keys': keys } : {}),
      };
      const files: Record<string, Buffer> = { 'meta-data': Buffer.from(JSON.stringify(md)), 'user-data': u.v };
      if (nw.v.length > 0) files['network-config'] = nw.v;
      return { ok: true, files, metaData: md };
    }
    const md: Obj = {
      ...(instancetype ? { instance_type: instancetype } : {}),
      instance_id: `${vmi.metadata.name}.${vmi.metadata.namespace ?? 'default'}`,
      ...(hostname ? { hostname } : {}),
      ...(uuid ? { uuid } : {}),
      ...(devices.length > 0 ? { devices } : {}),
      ...(hasKeys ? { public_keys: keys } : {}),
    };
    const files: Record<string, Buffer> = {
      'openstack/latest/meta_data.json': Buffer.from(JSON.stringify(md)),
      'openstack/latest/user_data': u.v,
    };
    if (nw.v.length > 0) files['openstack/latest/network_data.json'] = nw.v;
    return { ok: true, files, metaData: md };
  }
  return { ok: false, message: 'no cloud-init volume' };
}

// buildDevicesMetadata for what the spec pins: a tagged interface with
// pciAddress is at that address in the domain (KubeVirt puts it there).
export function pinnedDevices(vmi: Obj): Obj[] {
  const out: Obj[] = [];
  for (const i of (vmi.spec?.domain?.devices?.interfaces ?? []) as Obj[]) {
    if (!i.tag || !i.pciAddress) continue;
    out.push({
      type: 'nic',
      bus: 'pci',
      address: String(i.pciAddress).toLowerCase(),
      ...(i.macAddress ? { mac: i.macAddress } : {}),
      tags: [i.tag],
    });
  }
  return out;
}
