// Budgets on what a VMI owner can make the agent do. Each is checked before
// the work it bounds, so a hostile annotation or Secret costs a bounded
// amount of memory and CPU and is refused with a terminal error naming the
// field. One agent serves every tenant of its node under a 128 MiB heap: a
// budget that is generous for one VM is what keeps the others seeded.
import { VmseedError } from '../errors.ts';

/**
 * The agent's default for --max-user-data-bytes. 1 MiB: the largest Secret the API server stores,
 * so any user-data KubeVirt can take from a secretRef fits, and one tenant's seed stays small
 * beside the agent's 128 MiB heap (KubeVirt itself has no bound but the object size).
 */
export const DEFAULT_MAX_USER_DATA_BYTES = 1024 * 1024;
/** The agent's default for --max-network-data-bytes: 1 MiB is far above any real network config. */
export const DEFAULT_MAX_NETWORK_DATA_BYTES = 1024 * 1024;

/** Fixed budgets (bytes, entries) on what one VMI's seed may ask for, each checked before its work. */
export const LIMITS = Object.freeze({
  // Kubernetes refuses an object whose annotations add up to more than
  // 256 KiB (apimachinery TotalAnnotationSizeLimitB); local manifests are
  // held to the same.
  annotationBytes: 256 * 1024,
  // YAML that cloud-init users write uses a handful of anchors at most; an
  // alias bomb needs dozens. The expanded size is bounded separately.
  yamlAliases: 64,
  // js-yaml's own default is 100; cloud-config rarely goes past 10.
  yamlDepth: 64,
  // A parsed document may expand (through aliases) to at most this many
  // bytes when the caller gives no tighter bound.
  yamlExpandedBytes: 1024 * 1024,
  // Entry caps: far above any real seed, low enough that a list cannot make
  // a reconcile slow.
  files: 64,
  sshKeys: 256,
  accessCredentials: 64,
  initUsers: 64,
  initFiles: 64,
  initNics: 32,
  // A VMI's own interface lists (forceDHCP reads their MACs): far above
  // the PCI slots a domain has for NICs.
  vmiInterfaces: 256,
  nicRoutes: 64,
  dnsEntries: 16,
  userGroups: 64,
  // A password is hashed with 5,000 rounds of SHA-512 over its bytes
  // (crypt-sha512.ts): a 1 MiB "password" would cost minutes of CPU.
  passwordBytes: 1024,
});

/** The terminal LIST_TOO_LONG error for `field` holding `length` entries, more than `max`. */
export function listTooLong(field: string, length: number, max: number): VmseedError {
  return new VmseedError(
    'LIST_TOO_LONG',
    `${field} has ${length} entries, more than the ${max} allowed; split the seed or shorten the list`,
    {
      kind: 'terminal',
      field,
    },
  );
}

/** Throws listTooLong's error when `list` has more than `max` entries. */
export function checkListLength(list: readonly unknown[], max: number, field: string): void {
  if (list.length > max) throw listTooLong(field, list.length, max);
}

export interface SeedBudgetLimits {
  maxUserDataBytes: number;
  maxNetworkDataBytes: number;
  // Everything in the seed together (meta-data, user-data, network-config,
  // vendor-data). Default: 2 × maxUserDataBytes + maxNetworkDataBytes, room
  // for user-data, vendor-data of the same bound, network data and meta-data.
  maxSeedBytes?: number;
}

export function defaultSeedBytes(limits: SeedBudgetLimits): number {
  return limits.maxSeedBytes ?? 2 * limits.maxUserDataBytes + limits.maxNetworkDataBytes;
}

export interface BudgetSnapshot {
  maxUserDataBytes: number;
  maxSeedBytes: number;
  userData: number;
  seed: number;
}

/**
 * A running count of the bytes one render has committed to, so a seed too large is refused
 * (terminal USERDATA_TOO_LARGE or SEED_TOO_LARGE) before its big buffers (base64 of files, the
 * merged cloud-config, its serialisation) are made. One per render.
 */
export class SeedBudget {
  readonly maxUserDataBytes: number;
  readonly maxSeedBytes: number;
  #userData = 0;
  #seed = 0;

  constructor(limits: SeedBudgetLimits) {
    this.maxUserDataBytes = limits.maxUserDataBytes;
    this.maxSeedBytes = defaultSeedBytes(limits);
  }

  // The counters as plain data, so a step run in a worker thread
  // (src/cloudinit/pure-ops.ts) charges the same budget and hands it back.
  snapshot(): BudgetSnapshot {
    return {
      maxUserDataBytes: this.maxUserDataBytes,
      maxSeedBytes: this.maxSeedBytes,
      userData: this.#userData,
      seed: this.#seed,
    };
  }

  static fromSnapshot(s: BudgetSnapshot): SeedBudget {
    const b = new SeedBudget({
      maxUserDataBytes: s.maxUserDataBytes,
      maxNetworkDataBytes: 0,
      maxSeedBytes: s.maxSeedBytes,
    });
    b.#userData = s.userData;
    b.#seed = s.seed;
    return b;
  }

  // Takes over what a copy of this budget charged (counters only grow).
  adopt(s: BudgetSnapshot): void {
    this.#userData = Math.max(this.#userData, s.userData);
    this.#seed = Math.max(this.#seed, s.seed);
  }

  get userDataRemaining(): number {
    return Math.max(0, this.maxUserDataBytes - this.#userData);
  }

  get seedRemaining(): number {
    return Math.max(0, this.maxSeedBytes - this.#seed);
  }

  // Bytes that will end up in user-data (each part of a merge, at least as
  // large as its share of the result).
  userData(bytes: number, field: string): void {
    if (this.#userData + bytes > this.maxUserDataBytes) {
      throw new VmseedError(
        'USERDATA_TOO_LARGE',
        `user-data from ${field} would be more than ${this.#userData + bytes} bytes, over the limit of ${this.maxUserDataBytes} bytes; ` +
          'shrink it (gzip is accepted for user-data alone) or raise --max-user-data-bytes',
        { kind: 'terminal', field },
      );
    }
    this.#userData += bytes;
  }

  // Bytes of any seed file (user-data is charged here once, when final).
  seed(bytes: number, field: string): void {
    if (this.#seed + bytes > this.maxSeedBytes) {
      throw new VmseedError(
        'SEED_TOO_LARGE',
        `the seed would be more than ${this.#seed + bytes} bytes with ${field}, over the limit of ${this.maxSeedBytes} bytes ` +
          '(twice --max-user-data-bytes plus --max-network-data-bytes); shrink meta-data, vendor-data or the referenced objects',
        { kind: 'terminal', field },
      );
    }
    this.#seed += bytes;
  }
}

/**
 * Decoded size of standard base64 text, without decoding it: an upper bound (CR/LF count as
 * data), which is what a budget needs.
 */
export function base64DecodedUpperBound(encodedLength: number): number {
  return Math.ceil(encodedLength / 4) * 3;
}

/** Length of the padded standard base64 of `bytes` bytes, without line breaks. */
export function base64EncodedLength(bytes: number): number {
  return Math.ceil(bytes / 3) * 4;
}

/**
 * Lets the event loop run between the stages of a render (each parse or serialisation is one
 * synchronous block; together they would be one long one when the referenced objects come from
 * memory).
 */
export function yieldToLoop(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}
