// What the caller of renderSeed (render.ts) decides: which VMIs are vmseed's,
// the limits on what a VMI owner can make it do, and where heavy steps run.
import { DEFAULT_MAX_USER_DATA_BYTES } from './limits.ts';
import type { DomainDevice, VcpuPin } from './devices-metadata.ts';
import type { SaltProvider } from './init/password-salt.ts';
import type { VmiObject } from '../api/objects.ts';
import type { CiProfile } from './schema/ci-validator.ts';
import type { Offload } from './pure-ops.ts';
import type { VendorDataRef } from './userdata/vendor-data.ts';

/** renderSeed's options: whose volumes vmseed builds, the size limits, defaults, and where heavy steps run. */
export interface RenderOptions {
  // 'own': vmseed builds the seed for cloudInitNoCloud/cloudInitConfigDrive
  // volumes (local mode, plain libvirt). 'ignore': virt-launcher builds them.
  kubevirtVolumes: 'own' | 'ignore';
  // Limits on decoded data from any source. KubeVirt's 2048-byte limit is for
  // inline data in the object only (and pushes users to Secrets); a seed on
  // disk has no such constraint.
  maxUserDataBytes: number;
  maxNetworkDataBytes: number;
  // Operator-wide vendor-data (`--vendor-data-from namespace/name`): a
  // ConfigMap whose key (default "vendor-data") goes to every seed whose VMI
  // sets no vendorData/vendorDataFrom of its own.
  defaultVendorData?: VendorDataRef;
  // Salt for the SHA-512 crypt of init.users[].passwordFrom. Default:
  // deriveSalt (from VMI uid and user name; see init/password-salt.ts for why).
  passwordSalt?: SaltProvider;
  // Bound on all seed files together (default: see SeedBudget).
  maxSeedBytes?: number;
  // Where the YAML parse/merge/serialise steps run (pure-ops.ts); default:
  // this thread. The agent gives its worker pool (src/agent/render-pool.ts).
  offload?: Offload;
  // Aborted when the agent stops: a step on a worker is ended (CANCELLED).
  signal?: AbortSignal;
  // Check user-data, vendor-data and NoCloud network-config against
  // cloud-init's schemas of `release` (files in `dir`, schema-store.ts);
  // absent or 'off': no check. A VMI's annotation vmseed.io/cloud-init-version
  // picks its own release (schema/release-annotation.ts).
  schemaCheck?: SchemaCheckOptions;
}

/** RenderOptions.schemaCheck: where the schemas are, the node's default release, where a failed check is logged. */
export interface SchemaCheckOptions {
  dir: string;
  release: CiProfile | 'off';
  // Called when the check itself fails (never with document content).
  warn?: (fields: Record<string, unknown>, message: string) => void;
  // Asked when no check against `release` has run in this thread yet (its
  // first costs a few hundred milliseconds of compiling): true skips the
  // check for now, and the caller renders the VMI again once the schema is
  // warm, so a seed never waits for it. Absent: the check runs.
  deferCold?: (vmi: VmiObject, release: CiProfile) => boolean;
}

export const DEFAULT_RENDER_OPTIONS: RenderOptions = Object.freeze({
  kubevirtVolumes: 'own',
  maxUserDataBytes: DEFAULT_MAX_USER_DATA_BYTES,
  maxNetworkDataBytes: 64 * 1024,
});

// Per-VMI facts from outside the objects, when the caller has them.
export interface RenderContext {
  // The running domain's interfaces and host devices (from its XML), for the
  // ConfigDrive `devices` metadata; without it only what the spec pins is listed.
  domainDevices?: DomainDevice[];
  // The domain's <cputune><vcpupin>s, for host devices' `alignedCPUs`.
  vcpuPins?: VcpuPin[];
  // Where this VMI's cloud-init posts its progress events (the agent's
  // report URL, userdata/reporting-config.ts); absent: no reporting part.
  reportUrl?: string;
}
