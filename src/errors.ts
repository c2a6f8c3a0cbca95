// Typed errors with stable codes. The same code is used in the Event, the log
// line, the metric label and the status page, so codes form a closed set:
// adding one means adding it here, which keeps metric label values bounded.

export const ERROR_CODES = [
  // ISO writer and image store (src/disk)
  'ISO_PATH_EMPTY',
  'ISO_PATH_DUPLICATE',
  'ISO_NAME_TOO_LONG',
  'ISO_NAME_INVALID',
  'ISO_LABEL_INVALID',
  'ISO_TOO_LARGE',
  'ISO_NOT_AN_IMAGE',
  'ISO_TIMESTAMP_INVALID',
  'STORE_KEY_INVALID',
  'STORE_IO_FAILED',
  'STORE_UNSAFE_PATH',
  // seed rendering (src/cloudinit)
  'ANNOTATION_INVALID',
  'DATASOURCE_UNKNOWN',
  'USERDATA_BASE64_INVALID',
  'NETWORKDATA_BASE64_INVALID',
  'USERDATA_SOURCE_CONFLICT',
  'NETWORKDATA_SOURCE_CONFLICT',
  'USERDATA_TOO_LARGE',
  'NETWORKDATA_TOO_LARGE',
  'USERDATA_CLOUDCONFIG_INVALID',
  'USERDATA_NO_HEADER',
  'NETWORKDATA_INVALID',
  'NETWORKDATA_UNSUPPORTED_FOR_DATASOURCE',
  'SECRET_NOT_FOUND',
  'SECRET_KEY_NOT_FOUND',
  'CONFIGMAP_NOT_FOUND',
  'CONFIGMAP_KEY_NOT_FOUND',
  'KUBEVIRT_VOLUME_CONFLICT',
  'ADOPTED_INVALID',
  'ADOPTION_SKIPPED',
  'REVIEW_UNVERIFIED',
  'CLOUDINIT_SOURCE_MISSING',
  'METADATA_INVALID',
  'VENDORDATA_INVALID',
  'INIT_INVALID',
  'SECRET_DATA_INVALID',
  'MANIFEST_INVALID',
  'MANIFEST_TOO_LARGE',
  // beyond KubeVirt: Virtlet/oVirt features, vendor-data, network conversion
  'USERDATA_MERGE_UNSUPPORTED',
  'NETWORK_CONVERSION_UNSUPPORTED',
  'REFERENCE_KEY_INVALID',
  'VENDORDATA_NO_HEADER',
  // KubeVirt parity: admission rules, empty data, pass-through warnings
  'VOLUME_SOURCE_CONFLICT',
  'HOSTNAME_INVALID',
  'ACCESS_CREDENTIAL_INVALID',
  'CLOUDINIT_DATA_EMPTY',
  'NETWORKDATA_UNPARSED',
  'KUBEVIRT_INLINE_LIMIT',
  'DEVICE_METADATA_INCOMPLETE',
  // cloud-config checked against cloud-init's own schemas (src/cloudinit/schema)
  'CLOUD_INIT_VERSION_UNKNOWN',
  'CLOUDCONFIG_SCHEMA',
  'CLOUDCONFIG_DEPRECATED',
  'CLOUDCONFIG_UNCHECKED',
  'CLOUDCONFIG_SCHEMA_BUDGET',
  // local mode: a manifest naming another node (kubevirt.io/nodeName)
  'VMI_ON_OTHER_NODE',
  // input budgets: checked before the work they bound
  'ANNOTATION_TOO_LARGE',
  'YAML_TOO_COMPLEX',
  'LIST_TOO_LONG',
  'SEED_TOO_LARGE',
  'REFERENCES_TOO_MANY',
  // libvirt (src/libvirt)
  'DOMAIN_NOT_FOUND',
  'VIRSH_TIMEOUT',
  'VIRSH_NOT_FOUND',
  'VIRSH_FAILED',
  'TARGET_IN_USE',
  'ALIAS_IN_USE',
  'SEED_FILE_NOT_ACCESSIBLE',
  'DOMAIN_TRANSIENT',
  'DETACH_TIMEOUT',
  'SEEDED_AFTER_BOOT',
  'DEVICE_NOT_FOUND',
  'DOMAIN_STATE_UNSUPPORTED',
  'LIBVIRT_UNREACHABLE',
  'LAUNCHER_POD_UNKNOWN',
  'LAUNCHER_POD_INVALID',
  'SEED_PUBLISH_FAILED',
  // libvirt's RPC protocol spoken directly (src/libvirt/rpc)
  'LIBVIRT_TIMEOUT',
  'LIBVIRT_FAILED',
  'LIBVIRT_PROTOCOL',
  'LIBVIRT_CONNECTION_LOST',
  'LIBVIRT_ACCESS_DENIED',
  // domain XML from libvirt (virsh or RPC) that the XML reader refuses
  'DOMAIN_XML_REFUSED',
  // Kubernetes API (src/agent)
  'KUBE_API_UNAVAILABLE',
  'KUBE_API_THROTTLED',
  'KUBE_API_UNAUTHORIZED',
  'KUBE_API_FORBIDDEN',
  'KUBE_API_ERROR',
  // the cluster component's object service (--objects-url) not answering:
  // the VMI waits, it has not failed
  'OBJECTS_SERVICE_UNAVAILABLE',
  'VMI_UNPAUSE_FAILED',
  'SEED_GATE_WAITING',
  'SEED_GATE_MISSING',
  // NoCloud over HTTP (src/http/datasource*)
  'DATASOURCE_KEY_INVALID',
  'DATASOURCE_KEY_FILE_UNREADABLE',
  'DATASOURCE_URL_INVALID',
  // the render worker (src/agent/render-pool.ts) and shutdown
  'RENDER_TIMEOUT',
  'RENDER_WORKER_FAILED',
  'RENDER_QUEUE_FULL',
  'CANCELLED',
  // the state directory's lock (src/commands/agent/state-lock.ts)
  'STATE_DIR_LOCKED',
  'STATE_LOCK_FAILED',
  'DATASOURCE_OFF',
  // the 169.254.169.254 redirect (src/redirect)
  'REDIRECT_APPLY_FAILED',
  'REDIRECT_INVALID',
  // configuration
  'CONFIG_INVALID',
  'INTERNAL',
  // local mode: a VMI's manifest does not parse now, its seed is from before
  'SOURCE_STALE',
] as const;

/**
 * A stable error code, one of ERROR_CODES: the same in Events, logs, metric
 * labels and the status page.
 */
export type ErrorCode = (typeof ERROR_CODES)[number];

/**
 * retryable: backoff and requeue (the world may fix itself: a Secret appears, a
 * domain gets defined). terminal: wait until the object changes.
 */
export type ErrorKind = 'retryable' | 'terminal';

export interface VmseedErrorOptions {
  kind?: ErrorKind;
  // The field of the input the error is about, e.g. `userDataBase64` or
  // `files[2].path`, so a VM owner knows where to look.
  field?: string;
  cause?: unknown;
}

/**
 * An error with a stable code, a kind (default terminal) and the input field it
 * is about; toJSON() leaves the cause out, since a cause may quote user input.
 */
export class VmseedError extends Error {
  readonly code: ErrorCode;
  readonly kind: ErrorKind;
  readonly field: string | undefined;

  constructor(code: ErrorCode, message: string, options: VmseedErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = 'VmseedError';
    this.code = code;
    this.kind = options.kind ?? 'terminal';
    this.field = options.field;
  }

  get retryable(): boolean {
    return this.kind === 'retryable';
  }

  // What goes into Events, logs and the status page: code and message only,
  // never the cause (a cause may quote user input).
  toJSON(): { code: ErrorCode; message: string; kind: ErrorKind; field?: string } {
    return { code: this.code, message: this.message, kind: this.kind, ...(this.field ? { field: this.field } : {}) };
  }
}

/** Whether `e` is a VmseedError. */
export function isVmseedError(e: unknown): e is VmseedError {
  return e instanceof VmseedError;
}

/**
 * `e` as a VmseedError: anything that is not ours becomes a retryable INTERNAL,
 * without echoing its message (it may contain user data from a parser).
 */
export function asVmseedError(e: unknown): VmseedError {
  if (e instanceof VmseedError) return e;
  return new VmseedError('INTERNAL', 'internal error; see the agent log for details', { kind: 'retryable', cause: e });
}

/**
 * The retryable CANCELLED of work the agent's stop deadline passed on: not a
 * failure of the VMI, it runs again at the next start.
 */
export function cancelledError(what = 'the work'): VmseedError {
  return new VmseedError('CANCELLED', `the agent is stopping; ${what} was cancelled and runs again at the next start`, {
    kind: 'retryable',
  });
}

/**
 * What a step ended by `signal` throws: the signal's own CANCELLED reason (its
 * VMI was deleted or changed under the reconcile), else the stop's.
 */
export function cancelledBy(signal: AbortSignal | undefined, what?: string): VmseedError {
  const reason: unknown = signal?.reason;
  return reason instanceof VmseedError && reason.code === 'CANCELLED' ? reason : cancelledError(what);
}
