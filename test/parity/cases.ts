// KubeVirt's own cloud-init test cases, as VMIs. `from` names the test each
// case is taken from; inputs are those tests' values. What KubeVirt makes of
// each case is computed by kubevirt-model.ts; `differs` names the documented
// differences (docs/kubevirt-differences.md) that apply to the case.
import type { Secrets } from './kubevirt-model.ts';

type Obj = Record<string, any>;

// Documented differences; each is one row of the docs table.
export type Difference =
  // ConfigDrive instance_id is the uuid, not "<name>.<namespace>".
  | 'configdrive-instance-id'
  // No firmware UUID: a stable UUIDv5 instead of a random UUID per launch.
  | 'stable-instance-id'
  // Inline data over 2048 bytes: a warning, not a rejection.
  | 'inline-limit'
  // The Secret key `value` is read after userdata/userData.
  | 'secret-value-key'
  // A tag on an interface without pciAddress (or a host device/GPU) needs
  // the domain; without it vmseed omits the device and warns.
  | 'device-needs-domain'
  // network-config v1/v2 given for ConfigDrive is converted to network_data.json,
  // network_data.json given for NoCloud to v2.
  | 'network-converted'
  // A VirtualMachine manifest without firmware.uuid: the legacy UUIDv5 of the
  // VM name, not the random UUID KubeVirt >= 1.6 stores at creation.
  | 'vm-legacy-firmware-uuid';

export interface ParityCase {
  name: string;
  from: string;
  vmi: Obj;
  secrets?: Secrets;
  differs?: Difference[];
  // Warning codes vmseed must print (stderr) for this case.
  warnings?: string[];
  // Given to vmseed as a VirtualMachine whose template is `vmi`.
  vm?: boolean;
}

const FW = '5d307ca9-b3ef-428c-8861-06e72d69f223';

function vmi(volumes: Obj[], extra: { spec?: Obj; metadata?: Obj; firmware?: boolean } = {}): Obj {
  return {
    apiVersion: 'kubevirt.io/v1',
    kind: 'VirtualMachineInstance',
    metadata: { name: 'testvmi', namespace: 'kubevirt-test-default', ...(extra.metadata ?? {}) },
    spec: {
      domain: {
        ...(extra.firmware === false ? {} : { firmware: { uuid: FW } }),
        resources: { requests: { memory: '128Mi' } },
        devices: {
          disks: volumes.map((v) => ({ name: v.name, disk: { bus: 'virtio' } })),
          ...(extra.spec?.devices ?? {}),
        },
      },
      volumes,
      ...Object.fromEntries(Object.entries(extra.spec ?? {}).filter(([k]) => k !== 'devices')),
    },
  };
}

const nc = (src: Obj): Obj => ({ name: 'cloudinitdisk', cloudInitNoCloud: src });
const cd = (src: Obj): Obj => ({ name: 'cloudinitdisk', cloudInitConfigDrive: src });
const b64 = (s: string) => Buffer.from(s).toString('base64');
const containerDisk = {
  name: 'containerdisk',
  containerDisk: { image: 'quay.io/kubevirt/alpine-container-disk-demo' },
};

// pkg/cloud-init/cloud-init_test.go
const FAKE_USER = 'fake\nuser\ndata\n';
const FAKE_NET = 'fake\nnetwork\ndata\n';
const GARBAGE = '#######garbage******';
// tests/vmi_cloudinit_test.go
const USER_SCRIPT = '#!/bin/sh\n\ntouch /cloud-init-userdata-executed\n';
const NOCLOUD_NET = '#Test networkData';
const CONFIGDRIVE_NET = '{"config":"test networkData"}';
// tests/compute/credentials.go
const CRED_USER = '#cloud-config\nchpasswd: { expire: False }\n';
const KEY = 'ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC2 test-ssh-key';

const secretRef = { name: 'cloudinit-secret' };

function both(
  name: string,
  from: string,
  src: Obj,
  opts: Omit<ParityCase, 'name' | 'from' | 'vmi'> & { extra?: Parameters<typeof vmi>[1] } = {},
): ParityCase[] {
  const { extra, ...rest } = opts;
  return [
    { name: `nocloud: ${name}`, from, vmi: vmi([nc(src)], extra), ...rest },
    {
      name: `configdrive: ${name}`,
      from,
      vmi: vmi([cd(src)], extra),
      ...rest,
      differs: ['configdrive-instance-id', ...(rest.differs ?? [])],
    },
  ];
}

export const CASES: ParityCase[] = [
  // cloud-init_test.go "A new VirtualMachineInstance definition"
  // "fake\nuser\ndata" has no header cloud-init knows: vmseed says so (a lint, not a refusal).
  ...both(
    'userDataBase64',
    'cloud-init_test.go: should succeed to verify userDataBase64',
    { userDataBase64: b64(FAKE_USER) },
    { warnings: ['USERDATA_NO_HEADER'] },
  ),
  ...both(
    'userDataBase64 and networkData',
    'cloud-init_test.go: should succeed to verify userDataBase64 and networkData',
    { userDataBase64: b64(FAKE_USER), networkData: FAKE_NET },
    { warnings: ['USERDATA_NO_HEADER', 'NETWORKDATA_UNPARSED'] },
  ),
  ...both(
    'userDataBase64 and networkDataBase64',
    'cloud-init_test.go: should succeed to verify userDataBase64 and networkDataBase64',
    { userDataBase64: b64(FAKE_USER), networkDataBase64: b64(FAKE_NET) },
    { warnings: ['USERDATA_NO_HEADER', 'NETWORKDATA_UNPARSED'] },
  ),
  ...both(
    'userData',
    'cloud-init_test.go: should succeed to verify userData',
    { userData: FAKE_USER },
    { warnings: ['USERDATA_NO_HEADER'] },
  ),
  ...both(
    'networkData without userData',
    'cloud-init_test.go: should succeed to verify networkData if there is no userData',
    { networkData: FAKE_NET },
    { warnings: ['NETWORKDATA_UNPARSED'] },
  ),
  ...both('bad UserDataBase64', 'cloud-init_test.go: should fail to verify bad cloudInitNoCloud UserDataBase64', {
    userDataBase64: GARBAGE,
  }),
  ...both('bad NetworkDataBase64', 'cloud-init_test.go: should fail to verify bad cloudInitNoCloud NetworkDataBase64', {
    userData: 'fake',
    networkDataBase64: GARBAGE,
  }),
  ...both(
    'neither userData nor networkData',
    'cloud-init_test.go: should fail to verify if there is no userData nor networkData',
    {},
  ),
  ...both(
    'secretRefs, lowercase keys',
    'cloud-init_test.go: should resolve no-cloud data from volume',
    { secretRef, networkDataSecretRef: secretRef },
    {
      secrets: { 'cloudinit-secret': { userdata: 'secret-userdata', networkdata: 'secret-networkdata' } },
      warnings: ['USERDATA_NO_HEADER', 'NETWORKDATA_UNPARSED'],
    },
  ),
  ...both(
    'secretRefs, camelCase keys',
    'cloud-init_test.go: should resolve camel-case no-cloud data from volume',
    { secretRef, networkDataSecretRef: secretRef },
    {
      secrets: { 'cloudinit-secret': { userData: 'secret-userdata', networkData: 'secret-networkdata' } },
      warnings: ['USERDATA_NO_HEADER', 'NETWORKDATA_UNPARSED'],
    },
  ),
  ...both(
    'secretRefs, neither key exists',
    'cloud-init_test.go: should fail if both userdata and network data does not exist',
    { secretRef, networkDataSecretRef: secretRef },
    { secrets: { 'cloudinit-secret': { other: 'x' } } },
  ),

  // tests/vmi_cloudinit_test.go
  {
    name: 'nocloud: user-data from k8s secret',
    from: 'vmi_cloudinit_test.go [test_id:1618]',
    vmi: vmi([containerDisk, nc({ secretRef: { name: 'userdata-secret' } })]),
    secrets: { 'userdata-secret': { userdata: USER_SCRIPT } },
  },
  {
    name: 'nocloud: userDataBase64 script',
    from: 'vmi_cloudinit_test.go [test_id:1615]',
    vmi: vmi([containerDisk, nc({ userDataBase64: b64(USER_SCRIPT) })]),
  },
  {
    name: 'configdrive: userDataBase64 script',
    from: 'vmi_cloudinit_test.go [test_id:3178]',
    vmi: vmi([containerDisk, cd({ userDataBase64: b64(USER_SCRIPT) })]),
    differs: ['configdrive-instance-id'],
  },
  {
    name: 'nocloud: networkData',
    from: 'vmi_cloudinit_test.go [test_id:3181]',
    vmi: vmi([containerDisk, nc({ userData: '#cloud-config\n', networkData: NOCLOUD_NET })]),
    warnings: ['NETWORKDATA_UNPARSED'],
  },
  {
    name: 'nocloud: networkDataBase64',
    from: 'vmi_cloudinit_test.go [test_id:3182]',
    vmi: vmi([containerDisk, nc({ userData: '#cloud-config\n', networkDataBase64: b64(NOCLOUD_NET) })]),
    warnings: ['NETWORKDATA_UNPARSED'],
  },
  {
    name: 'nocloud: networkdata from k8s secret',
    from: 'vmi_cloudinit_test.go [test_id:3183]',
    vmi: vmi([containerDisk, nc({ userData: '#cloud-config\n', networkDataSecretRef: { name: 'nd' } })]),
    secrets: { nd: { networkdata: NOCLOUD_NET } },
    warnings: ['NETWORKDATA_UNPARSED'],
  },
  {
    name: 'configdrive: networkData',
    from: 'vmi_cloudinit_test.go [test_id:3184]',
    vmi: vmi([containerDisk, cd({ userData: '#cloud-config\n', networkData: CONFIGDRIVE_NET })]),
    differs: ['configdrive-instance-id'],
    warnings: ['NETWORKDATA_UNPARSED'],
  },
  {
    name: 'configdrive: meta_data with tagged devices',
    from: 'vmi_cloudinit_test.go [test_id:4622]',
    vmi: vmi([containerDisk, cd({ userData: '#cloud-config\n', networkData: CONFIGDRIVE_NET })], {
      metadata: { annotations: { 'kubevirt.io/instancetype-name': 'testInstancetype' } },
      spec: {
        devices: {
          interfaces: [
            {
              name: 'default',
              tag: 'specialNet',
              masquerade: {},
              pciAddress: '0000:01:00.0',
              macAddress: '9a:50:e8:6f:f3:fe',
            },
          ],
        },
        networks: [{ name: 'default', pod: {} }],
      },
    }),
    differs: ['configdrive-instance-id'],
    warnings: ['NETWORKDATA_UNPARSED'],
  },
  {
    name: 'configdrive: networkDataBase64',
    from: 'vmi_cloudinit_test.go [test_id:3185]',
    vmi: vmi([containerDisk, cd({ userData: '#cloud-config\n', networkDataBase64: b64(CONFIGDRIVE_NET) })]),
    differs: ['configdrive-instance-id'],
    warnings: ['NETWORKDATA_UNPARSED'],
  },
  {
    name: 'configdrive: networkdata from k8s secret',
    from: 'vmi_cloudinit_test.go [test_id:3186]',
    vmi: vmi([containerDisk, cd({ userData: '#cloud-config\n', networkDataSecretRef: { name: 'nd' } })]),
    secrets: { nd: { networkdata: CONFIGDRIVE_NET } },
    differs: ['configdrive-instance-id'],
    warnings: ['NETWORKDATA_UNPARSED'],
  },
  ...(['userdata/networkdata', 'userData/networkData'] as const).map((labels): ParityCase => {
    const [u, n] = labels.split('/');
    return {
      name: `configdrive: userdata and network-config from separate secrets (${labels})`,
      from: 'vmi_cloudinit_test.go [test_id:3187]',
      vmi: vmi([containerDisk, cd({ secretRef: { name: 'us' }, networkDataSecretRef: { name: 'ns' } })]),
      secrets: { us: { [u]: USER_SCRIPT }, ns: { [n]: CONFIGDRIVE_NET } },
      differs: ['configdrive-instance-id'],
      warnings: ['NETWORKDATA_UNPARSED'],
    };
  }),
  {
    name: 'configdrive: instance-id of a VMI without firmware',
    from: 'vmi_cloudinit_test.go: cloud-init instance-id should be stable',
    vmi: vmi([containerDisk, cd({ userData: '#cloud-config\npassword: fedora\nchpasswd: { expire: False }' })], {
      firmware: false,
    }),
    differs: ['configdrive-instance-id', 'stable-instance-id'],
  },

  {
    name: 'VirtualMachine without firmware.uuid',
    from: 'vmi_cloudinit_test.go: cloud-init instance-id should be stable (a VM, restarted)',
    vmi: vmi([containerDisk, cd({ userData: '#cloud-config\npassword: fedora\nchpasswd: { expire: False }' })], {
      firmware: false,
    }),
    vm: true,
    differs: ['configdrive-instance-id', 'vm-legacy-firmware-uuid'],
  },

  // tests/compute/credentials.go
  ...(['noCloud', 'configDrive'] as const).map((m): ParityCase => ({
    name: `${m}: ssh key from accessCredentials`,
    from: `credentials.go: using ${m === 'noCloud' ? 'nocloud' : 'configdrive [test_id:6224]'}`,
    vmi: vmi([containerDisk, (m === 'noCloud' ? nc : cd)({ userData: CRED_USER })], {
      spec: {
        accessCredentials: [
          { sshPublicKey: { source: { secret: { secretName: 'my-pub-key' } }, propagationMethod: { [m]: {} } } },
        ],
      },
    }),
    secrets: { 'my-pub-key': { my_key: KEY } },
    ...(m === 'configDrive' ? { differs: ['configdrive-instance-id'] as Difference[] } : {}),
  })),

  // vmi-create-admitter_test.go, vms-admitter_test.go (validateVolumes)
  {
    name: 'admitter: noCloud credential without a noCloud volume',
    from: 'vmi-create-admitter_test.go: should reject a noCloud ssh access credential when no noCloud volume exists',
    vmi: vmi([cd({ userData: ' ' })], {
      spec: {
        accessCredentials: [
          { sshPublicKey: { source: { secret: { secretName: 'k' } }, propagationMethod: { noCloud: {} } } },
        ],
      },
    }),
    secrets: { k: { key: KEY } },
  },
  {
    name: 'admitter: configDrive credential without a configDrive volume',
    from: 'vmi-create-admitter_test.go: should reject a configDrive ssh access credential when no configDrive volume exists',
    vmi: vmi([nc({ userData: ' ' })], {
      spec: {
        accessCredentials: [
          { sshPublicKey: { source: { secret: { secretName: 'k' } }, propagationMethod: { configDrive: {} } } },
        ],
      },
    }),
    secrets: { k: { key: KEY } },
  },
  {
    name: 'admitter: credential without source',
    from: 'vmi-create-admitter_test.go: should reject an ssh access credential without a source',
    vmi: vmi([cd({ userData: ' ' })], {
      spec: { accessCredentials: [{ sshPublicKey: { propagationMethod: { configDrive: {} } } }] },
    }),
  },
  {
    name: 'admitter: credential with two propagation methods',
    from: 'vmi-create-admitter.go validateAccessCredentials (methodCount)',
    vmi: vmi([nc({ userData: ' ' }), { name: 'cd2', cloudInitConfigDrive: { userData: ' ' } }], {
      spec: {
        accessCredentials: [
          {
            sshPublicKey: {
              source: { secret: { secretName: 'k' } },
              propagationMethod: { noCloud: {}, configDrive: {} },
            },
          },
        ],
      },
    }),
    secrets: { k: { key: KEY } },
  },
  {
    name: 'admitter: userData " " only',
    from: 'vmi-create-admitter_test.go: should accept CloudInitNoCloud volume if it has only a userData source',
    vmi: vmi([nc({ userData: ' ' })]),
  },
  {
    name: 'admitter: networkData " " only',
    from: 'vmi-create-admitter_test.go: should accept CloudInitNoCloud volume if it has only a networkData source',
    vmi: vmi([nc({ networkData: ' ' })]),
    warnings: ['NETWORKDATA_UNPARSED'],
  },
  {
    name: 'admitter: userData and networkData " "',
    from: 'vmi-create-admitter_test.go: should accept CloudInitNoCloud volume if it has both userData and networkData sources',
    vmi: vmi([nc({ userData: ' ', networkData: ' ' })]),
    warnings: ['NETWORKDATA_UNPARSED'],
  },
  {
    name: 'admitter: empty noCloud volume',
    from: 'vmi-create-admitter_test.go: should reject CloudInitNoCloud volume if either userData or networkData is missing',
    vmi: vmi([nc({})]),
  },
  ...[2048, 2049].flatMap((len) =>
    [false, true].map((enc): ParityCase => ({
      name: `admitter: userdata${enc ? ' base64' : ''} of ${len} bytes`,
      from: 'vms-admitter_test.go: should verify cloud-init userdata length',
      vmi: vmi([nc(enc ? { userDataBase64: b64('a'.repeat(len)) } : { userData: 'a'.repeat(len) })]),
      ...(len > 2048
        ? { differs: ['inline-limit'] as Difference[], warnings: ['KUBEVIRT_INLINE_LIMIT', 'USERDATA_NO_HEADER'] }
        : { warnings: ['USERDATA_NO_HEADER'] }),
    })),
  ),
  ...[2048, 2049].map((len): ParityCase => ({
    name: `admitter: networkdata of ${len} bytes`,
    from: 'vms-admitter_test.go: should verify cloud-init networkdata length',
    vmi: vmi([nc({ userData: '#config', networkData: 'a'.repeat(len) })]),
    ...(len > 2048
      ? {
          differs: ['inline-limit'] as Difference[],
          warnings: ['KUBEVIRT_INLINE_LIMIT', 'USERDATA_NO_HEADER', 'NETWORKDATA_UNPARSED'],
        }
      : { warnings: ['USERDATA_NO_HEADER', 'NETWORKDATA_UNPARSED'] }),
  })),
  {
    name: 'admitter: invalid base64 userdata',
    from: 'vms-admitter_test.go: should reject cloud-init with invalid base64 userdata',
    vmi: vmi([nc({ userDataBase64: GARBAGE })]),
  },
  {
    name: 'admitter: invalid base64 networkdata',
    from: 'vms-admitter_test.go: should reject cloud-init with invalid base64 networkdata',
    vmi: vmi([nc({ userData: 'fake', networkDataBase64: GARBAGE })]),
  },
  {
    name: 'admitter: multiple userdata sources',
    from: 'vms-admitter_test.go: should reject cloud-init with multiple userdata sources',
    vmi: vmi([nc({ userData: 'fake', secretRef: { name: 'fake' } })]),
    secrets: { fake: { userdata: 'x' } },
  },
  {
    name: 'admitter: multiple networkdata sources',
    from: 'vms-admitter_test.go: should reject cloud-init with multiple networkdata sources',
    vmi: vmi([nc({ userData: 'fake', networkData: 'fake', networkDataSecretRef: { name: 'fake' } })]),
    secrets: { fake: { networkdata: 'x' } },
  },
  {
    name: 'admitter: userData and userDataBase64',
    from: 'vmi-create-admitter.go validateVolumes (userDataSourceCount)',
    vmi: vmi([cd({ userData: '#cloud-config\n', userDataBase64: b64('#cloud-config\n') })]),
  },
  {
    name: 'admitter: a volume with two source types',
    from: 'vmi-create-admitter.go validateVolumes: must have exactly one source type set',
    vmi: vmi([
      {
        name: 'cloudinitdisk',
        cloudInitNoCloud: { userData: '#cloud-config\n' },
        cloudInitConfigDrive: { userData: '#cloud-config\n' },
      },
    ]),
  },
  {
    name: 'admitter: a second cloud-init volume with two user-data sources',
    from: 'vmi-create-admitter.go validateVolumes (every volume)',
    vmi: vmi([
      nc({ userData: '#cloud-config\n' }),
      { name: 'second', cloudInitConfigDrive: { userData: 'a', userDataBase64: b64('a') } },
    ]),
  },

  // KubeVirt's lookup order of Secret keys and its "required" rule
  {
    name: 'nocloud: Secret with empty userdata and filled userData',
    from: 'cloud-init.go readFirstFoundFileFromDir + readCloudInitData',
    vmi: vmi([containerDisk, nc({ secretRef })]),
    secrets: { 'cloudinit-secret': { userdata: '', userData: USER_SCRIPT } },
  },
  {
    name: 'nocloud: Secret with empty userdata, network data inline',
    from: 'cloud-init.go readFirstFoundFileFromDir + readCloudInitData',
    vmi: vmi([
      containerDisk,
      nc({ secretRef: { name: 'us' }, networkData: 'version: 2\nethernets:\n  eth0: {dhcp4: true}\n' }),
    ]),
    secrets: { us: { userdata: '', userData: USER_SCRIPT } },
  },
  {
    name: 'configdrive: Secret with empty networkdata and filled networkData',
    from: 'cloud-init.go resolveConfigDriveSecrets',
    vmi: vmi([containerDisk, cd({ networkDataSecretRef: { name: 'nd' } })]),
    secrets: { nd: { networkdata: '', networkData: CONFIGDRIVE_NET } },
  },
  {
    name: 'nocloud: Secret with only the key value',
    from: 'cloud-init.go resolveNoCloudSecrets (keys userdata, userData)',
    vmi: vmi([containerDisk, nc({ secretRef })]),
    secrets: { 'cloudinit-secret': { value: USER_SCRIPT } },
    differs: ['secret-value-key'],
  },

  // cloud-init.go ReadCloudInitVolumeDataSource details
  {
    name: 'nocloud: only the first cloud-init volume is used',
    from: 'cloud-init.go ReadCloudInitVolumeDataSource (first volume)',
    vmi: vmi([
      containerDisk,
      nc({ userData: '#cloud-config\nhostname: first\n' }),
      { name: 'second', cloudInitConfigDrive: { userData: '#cloud-config\nhostname: second\n' } },
    ]),
  },
  {
    name: 'nocloud: cluster instancetype wins over namespaced',
    from: 'cloud-init.go ReadCloudInitVolumeDataSource (ClusterInstancetypeAnnotation)',
    vmi: vmi([nc({ userData: '#cloud-config\n' })], {
      metadata: {
        annotations: {
          'kubevirt.io/instancetype-name': 'ns-type',
          'kubevirt.io/cluster-instancetype-name': 'cluster-type',
        },
      },
    }),
  },
  {
    name: 'configdrive: instancetype',
    from: 'cloud-init_test.go: should match the generated configdrive metadata',
    vmi: vmi([cd({ userData: '#cloud-config\n' })], {
      metadata: { annotations: { 'kubevirt.io/instancetype-name': 'fake.fake-instancetype' } },
    }),
    differs: ['configdrive-instance-id'],
  },
  // vmi-create-admitter_test.go: should accept valid hostname / should reject invalid hostname; the other inputs
  // reach IsDNS1123Label's other causes (length, dots, upper case).
  {
    name: 'admitter: valid hostname',
    from: 'vmi-create-admitter_test.go: should accept valid hostname',
    vmi: vmi([cd({ userData: '#cloud-config\n' })], { spec: { hostname: 'test' } }),
    differs: ['configdrive-instance-id'],
  },
  ...['test+bad', 'a'.repeat(64), 'my.host', 'Test', '-test', 'a'.repeat(70) + '.x'].map((hostname): ParityCase => ({
    name: `admitter: invalid hostname "${hostname.length > 20 ? `${hostname.slice(0, 8)}…(${hostname.length})` : hostname}"`,
    from: 'vmi-create-admitter_test.go: should reject invalid hostname (validateHostNameNotConformingToDNSLabelRules)',
    vmi: vmi([nc({ userData: '#cloud-config\n' })], { spec: { hostname } }),
  })),
  {
    name: 'admitter: hostname of 63 characters',
    from: 'apimachinery IsDNS1123Label: DNS1123LabelMaxLength',
    vmi: vmi([nc({ userData: '#cloud-config\n' })], { spec: { hostname: 'a'.repeat(63) } }),
  },
  {
    name: 'nocloud: hostname from spec.hostname',
    from: 'pkg/util/net/dns SanitizeHostname',
    vmi: vmi([nc({ userData: '#cloud-config\n' })], { spec: { hostname: 'myhost' } }),
  },
  {
    name: 'nocloud: dotted VMI name',
    from: 'pkg/util/net/dns SanitizeHostname',
    vmi: vmi([nc({ userData: '#cloud-config\n' })], { metadata: { name: 'web.example.com' } }),
  },
  {
    name: 'nocloud: long VMI name',
    from: 'pkg/util/net/dns SanitizeHostname',
    vmi: vmi([nc({ userData: '#cloud-config\n' })], { metadata: { name: 'a'.repeat(70) } }),
  },
  {
    name: 'nocloud: ssh keys of several Secrets, sorted, empty skipped',
    from: 'cloud-init.go resolveSSHPublicKeys',
    vmi: vmi([nc({ userData: '#cloud-config\n' })], {
      spec: {
        accessCredentials: [
          { sshPublicKey: { source: { secret: { secretName: 'a' } }, propagationMethod: { noCloud: {} } } },
          {
            sshPublicKey: {
              source: { secret: { secretName: 'qga' } },
              propagationMethod: { qemuGuestAgent: { users: ['fedora'] } },
            },
          },
          { sshPublicKey: { source: { secret: { secretName: 'b' } }, propagationMethod: { noCloud: {} } } },
        ],
      },
    }),
    secrets: {
      a: {
        key2: 'ssh-ed25519 AAAA2 two',
        'b-key': 'ssh-ed25519 AAAAb bee',
        key10: 'ssh-ed25519 AAAA10 ten',
        empty: '',
      },
      qga: { k: 'ssh-ed25519 AAAAq q' },
      b: { z: 'ssh-ed25519 AAAAz zed' },
    },
  },
  {
    name: 'configdrive: tagged interface without pciAddress',
    from: 'manager.go buildDevicesMetadata (address from the domain)',
    vmi: vmi([cd({ userData: '#cloud-config\n' })], {
      spec: {
        devices: { interfaces: [{ name: 'default', tag: 'nic0', masquerade: {} }] },
        networks: [{ name: 'default', pod: {} }],
      },
    }),
    differs: ['configdrive-instance-id', 'device-needs-domain'],
    warnings: ['DEVICE_METADATA_INCOMPLETE'],
  },
  {
    name: 'configdrive: network-config v2 given for ConfigDrive',
    from: 'cloud-init.go GenerateLocalData (network_data.json as given)',
    vmi: vmi([
      cd({
        userData: '#cloud-config\n',
        networkData: 'version: 2\nethernets:\n  eth0:\n    match: {macaddress: "52:54:00:12:34:56"}\n    dhcp4: true\n',
      }),
    ]),
    differs: ['configdrive-instance-id', 'network-converted'],
  },
  {
    name: 'nocloud: network_data.json given for NoCloud',
    from: 'cloud-init.go GenerateLocalData (network-config as given)',
    vmi: vmi([
      nc({
        userData: '#cloud-config\n',
        networkData:
          '{"links":[{"id":"eth0","type":"phy","ethernet_mac_address":"52:54:00:12:34:56"}],"networks":[{"id":"n0","link":"eth0","type":"ipv4_dhcp","network_id":"x"}],"services":[]}',
      }),
    ]),
    differs: ['network-converted'],
  },
];
