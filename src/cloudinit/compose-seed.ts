// The seed from what one input API read (kubevirt/volume-input.ts,
// annotation/annotation-input.ts): user-data composed, bounded and linted;
// the network config chosen; vendor-data; meta-data. Each file is charged to
// the seed budget in that order.
import { VmseedError } from '../errors.ts';
import { ANNOTATION } from './annotation/annotation.ts';
import type { ResolvedExtras } from './annotation/extras-input.ts';
import { buildDevicesMetadata } from './devices-metadata.ts';
import type { RefResolver, VmiObject, Datasource } from '../api/objects.ts';
import { isPassableNetworkError, passThroughWarning } from './kubevirt/network-passthrough.ts';
import type { ResolvedData } from './kubevirt/sources.ts';
import { yieldToLoop, type SeedBudget } from './limits.ts';
import { buildMetaData } from './metadata.ts';
import { INLINE_OFFLOAD, type Offload } from './pure-ops.ts';
import type { RenderContext, RenderOptions } from './render-options.ts';
import type { Seed, SeedWarning } from './seed.ts';
import type { UserDataParts } from './userdata/compose.ts';
import { quickBootstrapSentinel } from './userdata/bootstrap-sentinel.ts';
import { withReportingPart } from './userdata/reporting-config.ts';
import { resolveVendorData, vendorDataFile } from './userdata/vendor-data.ts';
import { mergeMetaData } from './metadata-merge.ts';
import { measureExpanded } from './yaml.ts';
import { schemaWarnings } from './schema/seed-warnings.ts';

/** What an input API (kubevirt/volume-input.ts, annotation/annotation-input.ts) hands composeSeed. */
export interface SeedInput {
  datasource: Datasource;
  namespace: string;
  data: ResolvedData;
  publicKeys: Record<string, string>;
  // What KubeVirt's webhook would warn about (a rejection has thrown).
  warnings: SeedWarning[];
  // The annotation is vmseed's API and refuses user-data and network data
  // cloud-init cannot load; a volume's is KubeVirt's, written as given.
  strict: boolean;
  // The annotation's Virtlet/oVirt fields; absent for a volume.
  extras?: ResolvedExtras;
}

// One render's composition, as every step reads it.
interface Composition {
  vmi: VmiObject;
  input: SeedInput;
  refs: RefResolver;
  budget: SeedBudget;
  options: RenderOptions;
  offload: Offload;
}

interface SeedPart {
  bytes?: Uint8Array;
  warnings: SeedWarning[];
}

export async function composeSeed(
  vmi: VmiObject,
  input: SeedInput,
  refs: RefResolver,
  budget: SeedBudget,
  options: RenderOptions,
  context: RenderContext,
): Promise<Seed> {
  const c: Composition = { vmi, input, refs, budget, options, offload: options.offload ?? INLINE_OFFLOAD };
  const user = await userDataPart(c);
  const network = await networkConfigPart(c);
  const own = await vendorDataPart(c);
  const vendor = withProgressReport(own, c, context.reportUrl);
  const meta = metaDataPart(c, context);
  // The documents as final, but the VMI's own vendor-data rather than
  // vmseed's progress-reporting wrapper (the owner's to fix, not vmseed's).
  const schema = await schemaWarnings(
    vmi,
    options,
    {
      userData: user.bytes,
      ...(own.raw ? { vendorData: own.raw.bytes } : {}),
      ...(input.datasource === 'nocloud' && network.bytes ? { networkConfig: network.bytes } : {}),
    },
    c.offload,
  );
  const sentinel = await bootstrapSentinelOf(c, user.bytes);
  return {
    datasource: input.datasource,
    metaData: meta.metaData,
    userData: user.bytes,
    ...(network.bytes ? { networkConfig: network.bytes } : {}),
    ...(vendor.bytes && vendor.bytes.length > 0 ? { vendorData: vendor.bytes } : {}),
    ...(vendor.progressNotReported ? { progressNotReported: vendor.progressNotReported } : {}),
    ...(sentinel !== 'none' ? { bootstrapSentinel: sentinel } : {}),
    warnings: [
      ...input.warnings,
      ...user.warnings,
      ...network.warnings,
      ...vendor.warnings,
      ...meta.warnings,
      ...schema,
    ],
  };
}

// Once per render, so the agent keeps one word about the user-data and
// never the user-data itself (the provisioning state `bootstrapped`).
async function bootstrapSentinelOf(c: Composition, userData: Uint8Array) {
  return (
    quickBootstrapSentinel(userData) ??
    (await c.offload.run(
      'bootstrapSentinel',
      [userData, c.options.maxUserDataBytes],
      userData.length,
      c.options.signal,
    ))
  );
}

async function userDataPart(c: Composition): Promise<SeedPart & { bytes: Uint8Array }> {
  const { input, budget, options } = c;
  const parts = userDataParts(input);
  const { composed, budget: charged } = await c.offload.run(
    'composeUserData',
    [parts, budget.snapshot()],
    mergeCost(parts, budget),
    options.signal,
  );
  budget.adopt(charged);
  const bytes = composed?.bytes ?? new Uint8Array();
  const field = composed?.field ?? input.data.userDataField;
  if (bytes.length > options.maxUserDataBytes) {
    throw tooLarge('USERDATA_TOO_LARGE', field, bytes.length, options.maxUserDataBytes);
  }
  budget.seed(bytes.length, field);
  await yieldToLoop();
  const warnings = composed?.merged ? [] : await lintUserData(c, bytes, field);
  await yieldToLoop();
  return { bytes, warnings };
}

function userDataParts({ data, extras }: SeedInput): Omit<UserDataParts, 'budget'> {
  const inline =
    data.userData && data.userData.length > 0 ? { bytes: data.userData, field: data.userDataField } : undefined;
  const script = extras?.fields.userDataScript;
  return {
    generated: extras?.generated ?? {},
    ...(extras?.from ? { from: extras.from } : {}),
    ...(inline ? { inline } : {}),
    ...(script !== undefined ? { script: { text: script, field: `${ANNOTATION}.userDataScript` } } : {}),
    mode: extras?.fields.userDataMerge ?? 'merge',
  };
}

// The bytes a merge works on, for the offload to choose where it runs. Only
// a merge (two parts or more, or userDataFrom's keys) parses and serialises;
// one part passes through as it is.
function mergeCost(parts: Omit<UserDataParts, 'budget'>, budget: SeedBudget): number {
  const { generated, from, inline, script } = parts;
  const count = (Object.keys(generated).length > 0 ? 1 : 0) + (from ? 1 : 0) + (inline ? 1 : 0);
  const merges = script === undefined && (count > 1 || (from !== undefined && from.spec.key === undefined));
  if (!merges) return 0;
  return (
    budget.snapshot().userData +
    (inline?.bytes.length ?? 0) +
    (from?.entries.reduce((n, e) => n + e.bytes.length, 0) ?? 0)
  );
}

// The annotation refuses cloud-config cloud-init cannot load. A volume's
// user-data is KubeVirt's: it writes it as given, and the guest still gets
// the SSH keys and network config of the seed, so vmseed warns instead of
// withholding the whole seed.
async function lintUserData(c: Composition, userData: Uint8Array, field: string): Promise<SeedWarning[]> {
  try {
    return await c.offload.run('lintUserData', [userData, field], userData.length, c.options.signal);
  } catch (e) {
    if (c.input.strict || !(e instanceof VmseedError) || e.code !== 'USERDATA_CLOUDCONFIG_INVALID') throw e;
    return [
      {
        code: 'USERDATA_CLOUDCONFIG_INVALID',
        field,
        message: `${e.message}. Written as given, as KubeVirt does: the seed's SSH keys and network config still apply`,
      },
    ];
  }
}

async function networkConfigPart(c: Composition): Promise<SeedPart> {
  const { vmi, input, budget, options } = c;
  const { data, datasource, extras } = input;
  const given = data.networkData && data.networkData.length > 0 ? data.networkData : undefined;
  if (given && given.length > options.maxNetworkDataBytes) {
    throw tooLarge('NETWORKDATA_TOO_LARGE', data.networkDataField, given.length, options.maxNetworkDataBytes);
  }
  if (given) budget.seed(given.length, data.networkDataField);
  try {
    const choice = {
      vmi,
      datasource,
      prefix: ANNOTATION,
      forceDHCP: extras?.fields.forceDHCP ?? false,
      ...(extras?.initNetwork ? { initNetwork: extras.initNetwork } : {}),
      ...(given ? { given: { bytes: given, field: data.networkDataField } } : {}),
    };
    const bytes = await c.offload.run('chooseNetworkConfig', [choice], given?.length ?? 0, options.signal);
    return { bytes, warnings: [] };
  } catch (e) {
    // KubeVirt writes a volume's network data as given, whatever it is; the
    // annotation (vmseed's own API) stays strict.
    if (input.strict || !given || !isPassableNetworkError(e)) throw e;
    return { bytes: given, warnings: [passThroughWarning(e, given, datasource, data.networkDataField)] };
  }
}

// vendorDataPart's `raw`: the VMI's vendor-data as given, before
// ConfigDrive's JSON wrapping.
interface VendorPart extends SeedPart {
  raw?: { bytes: Uint8Array; field: string };
}

async function vendorDataPart(c: Composition): Promise<VendorPart> {
  const { input, budget, options } = c;
  const fields = input.extras?.fields;
  const vendor = await resolveVendorData(fields, options.defaultVendorData, input.namespace, c.refs, ANNOTATION);
  if (!vendor) return { warnings: [] };
  budget.seed(vendor.bytes.length, vendor.field);
  const warnings = await c.offload.run(
    'lintVendorData',
    [vendor.bytes, vendor.field, options.maxUserDataBytes],
    vendor.bytes.length,
    options.signal,
  );
  return { bytes: vendorDataFile(vendor.bytes, input.datasource, vendor.field), warnings, raw: vendor };
}

// The vendor-data with cloud-init's reporting part added, charged to the
// seed budget; the VMI's own vendor-data was checked as it is (above).
function withProgressReport(
  vendor: VendorPart,
  c: Composition,
  reportUrl: string | undefined,
): SeedPart & { progressNotReported?: string } {
  if (reportUrl === undefined) return vendor;
  const combined = withReportingPart(vendor.raw?.bytes, reportUrl);
  if ('reason' in combined) return { ...vendor, progressNotReported: combined.reason };
  const field = vendor.raw?.field ?? 'vendor-data';
  c.budget.seed(combined.bytes.length - (vendor.raw?.bytes.length ?? 0), field);
  return { bytes: vendorDataFile(combined.bytes, c.input.datasource, field), warnings: vendor.warnings };
}

function metaDataPart(
  c: Composition,
  context: RenderContext,
): { metaData: Record<string, unknown>; warnings: SeedWarning[] } {
  const { vmi, input, budget } = c;
  const { datasource } = input;
  const devices =
    datasource === 'configdrive' ? buildDevicesMetadata(vmi, context.domainDevices, context.vcpuPins) : undefined;
  // Merged here: its inputs are in this thread, and cloning a 15,000-key
  // mapping to a worker and back costs more than the merge (bench:hostile).
  const metaData = mergeMetaData(
    buildMetaData(vmi, datasource, input.publicKeys, devices?.devices),
    input.extras?.fields.metaData,
    datasource,
    `${ANNOTATION}.metaData`,
  );
  budget.seed(metaDataSize(metaData, budget.seedRemaining), `${ANNOTATION}.metaData`);
  return { metaData, warnings: devices?.warnings ?? [] };
}

// meta-data's JSON size, measured (not serialised) against what is left of
// the seed budget; past it (or cyclic, which parsing already refuses), one
// byte more than what is left, so seed() refuses it.
function metaDataSize(metaData: Record<string, unknown>, remaining: number): number {
  const m = measureExpanded(metaData, remaining);
  return typeof m === 'number' ? m : remaining + 1;
}

function tooLarge(
  code: 'USERDATA_TOO_LARGE' | 'NETWORKDATA_TOO_LARGE',
  field: string,
  size: number,
  max: number,
): VmseedError {
  const what = code === 'USERDATA_TOO_LARGE' ? 'user-data' : 'network data';
  return new VmseedError(
    code,
    `${what} from ${field} is ${size} bytes, over the limit of ${max} bytes; shrink it (gzip is accepted for user-data) ` +
      'or raise the limit in the agent configuration',
    { kind: 'terminal', field },
  );
}
