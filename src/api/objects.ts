// The parts of Kubernetes and KubeVirt objects vmseed reads, as plain JSON
// shapes (what the API server sends). Kept minimal and structural so local
// mode (YAML files) and the informer (JSON) feed the same code. Types only,
// at the bottom of the layers: the pure cloudinit/ renders from them and
// kube/ fills them, so neither imports the other for them.

/** The metadata fields vmseed reads of any object. */
export interface ObjectMeta {
  name: string;
  namespace?: string;
  uid?: string;
  resourceVersion?: string;
  generation?: number;
  creationTimestamp?: string;
  deletionTimestamp?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  ownerReferences?: OwnerReference[];
}

export interface OwnerReference {
  apiVersion?: string;
  kind?: string;
  name?: string;
  uid?: string;
  controller?: boolean;
}

/** A core/v1 Secret: `data` base64 as on the wire, `stringData` only in manifests. */
export interface SecretObject {
  apiVersion?: string;
  kind?: 'Secret';
  metadata: ObjectMeta;
  type?: string;
  // Values are base64, as on the wire.
  data?: Record<string, string>;
  // Plain values; only seen in manifests (local mode), the API server folds them into data.
  stringData?: Record<string, string>;
}

/** A core/v1 ConfigMap: `data` plain text, `binaryData` base64. */
export interface ConfigMapObject {
  apiVersion?: string;
  kind?: 'ConfigMap';
  metadata: ObjectMeta;
  data?: Record<string, string>;
  // base64 values
  binaryData?: Record<string, string>;
}

/** A reference by name to an object in the referrer's namespace. */
export interface LocalObjectReference {
  name: string;
}

/**
 * A KubeVirt cloudInitNoCloud or cloudInitConfigDrive volume source: user-data
 * and network-data inline, base64, or from a Secret.
 */
export interface CloudInitSource {
  userData?: string;
  userDataBase64?: string;
  secretRef?: LocalObjectReference;
  networkData?: string;
  networkDataBase64?: string;
  networkDataSecretRef?: LocalObjectReference;
}

/** A VMI volume; only the cloud-init sources are typed, other kinds pass through. */
export interface VmiVolume {
  name: string;
  cloudInitNoCloud?: CloudInitSource;
  cloudInitConfigDrive?: CloudInitSource;
  [other: string]: unknown;
}

/** A VMI's spec.accessCredentials entry: SSH keys or a password from a Secret. */
export interface AccessCredential {
  sshPublicKey?: {
    source?: { secret?: { secretName: string } };
    propagationMethod?: {
      noCloud?: Record<string, never>;
      configDrive?: Record<string, never>;
      qemuGuestAgent?: unknown;
    };
  };
  userPassword?: unknown;
}

/** A KubeVirt VirtualMachineInstance, the fields vmseed reads (others pass through). */
export interface VmiObject {
  apiVersion?: string;
  kind?: 'VirtualMachineInstance';
  metadata: ObjectMeta;
  spec: {
    hostname?: string;
    subdomain?: string;
    // 'Paused' is the one vmseed acts on.
    startStrategy?: string;
    domain?: {
      firmware?: { uuid?: string; serial?: string };
      devices?: { disks?: Array<{ name: string; [k: string]: unknown }>; interfaces?: Array<Record<string, unknown>> };
      [k: string]: unknown;
    };
    volumes?: VmiVolume[];
    accessCredentials?: AccessCredential[];
    [k: string]: unknown;
  };
  status?: {
    nodeName?: string;
    // Pending, Scheduling, Scheduled, Running, Succeeded, Failed or Unknown.
    phase?: string;
    interfaces?: Array<{ name?: string; mac?: string; ipAddress?: string; ipAddresses?: string[] }>;
    [k: string]: unknown;
  };
}

/**
 * How src/cloudinit reaches referenced objects; the Kubernetes client and local
 * mode both implement it. `undefined` means "does not exist (404)"; transport
 * failures throw a retryable VmseedError (KUBE_API_UNAVAILABLE).
 */
export interface RefResolver {
  getSecret(namespace: string, name: string): Promise<SecretObject | undefined>;
  getConfigMap(namespace: string, name: string): Promise<ConfigMapObject | undefined>;
}

/** The seed's two formats (cloud-init's NoCloud and ConfigDrive datasources). */
export type Datasource = 'nocloud' | 'configdrive';

/** A libvirt domain's state as vmseed tells them apart. */
export type DomainState = 'running' | 'paused' | 'shutoff' | 'other';
