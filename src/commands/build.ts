// `vmseed build`: a seed image from files, like cloud-localds, without any
// external tool. Options are parsed once with one table; each seed source
// (today the files; later `--vmi vmi.yaml [--secret s.yaml ...]`) reads the
// parsed values and returns a Seed, and the rest (image, output) is shared.
import type { Datasource } from '../api/objects.ts';
import { readFile, writeFile, rename, stat, unlink } from 'node:fs/promises';
import { resolve, dirname, basename, join } from 'node:path';
import { parseArgs, type ParseArgsConfig } from 'node:util';
import type { Command, CliContext, ExitCode } from './cli.ts';
import { UsageError } from './cli.ts';
import { DATASOURCES, type Seed } from '../cloudinit/seed.ts';
import { parseYaml, where } from '../cloudinit/yaml.ts';
import { VmseedError } from '../errors.ts';
import { buildSeedImage } from '../disk/seed-image.ts';
import { mergeManifests, parseManifests } from '../agent/local/manifests.ts';
import { MemoryResolver } from '../cloudinit/refs/memory-resolver.ts';
import type { RefResolver } from '../api/objects.ts';
import { DEFAULT_RENDER_OPTIONS, renderSeed } from '../cloudinit/render.ts';
import { seedTimestamp } from '../cloudinit/timestamp.ts';
import { parseVendorDataFrom } from '../cloudinit/userdata/vendor-data.ts';
import { lintUserData } from '../cloudinit/userdata/user-data-lint.ts';
import { domainDevicesFromXml } from '../libvirt/domain-devices.ts';
import {
  lintDocument,
  lintFails,
  lintLines,
  SCHEMA_OPTIONS,
  SchemasMissingError,
  schemaTarget,
  type SchemaTarget,
} from './lint.ts';

/** `vmseed build --help`: both modes (files, or a VMI manifest) and their flags. */
export const BUILD_USAGE = `usage: vmseed build [--datasource nocloud|configdrive] --user-data F [--meta-data F]
                    [--network-config F] [--vendor-data F] -o OUT.iso
       vmseed build --vmi VMI.yaml [--objects S.yaml ...] [--vendor-data-from NS/NAME[/KEY]]
                    [--domain-xml DOMAIN.xml] -o OUT.iso
       either with [--lint [--cloud-init-version 22.4|25.1] [--cloud-init-schemas DIR]]

  --vmi renders the seed of a VirtualMachineInstance (or VirtualMachine)
  manifest exactly as the agent does, with its Secrets and ConfigMaps read
  from --objects files (or from the VMI file itself). The datasource comes
  from the VMI; the image timestamp from its creationTimestamp.
  --vendor-data-from names the ConfigMap (in --objects) the agent's flag of
  the same name would use as default vendor-data.
  --domain-xml takes the VM's libvirt domain (virsh dumpxml): ConfigDrive
  "devices" metadata then lists every tagged interface, host device and GPU
  at the guest address libvirt gave it, as KubeVirt's virt-launcher does;
  without it only interfaces with spec pciAddress are listed.
  --lint checks user-data (and, for nocloud, vendor-data and network-config)
  as 'vmseed lint' does, problems on stderr, and exits 2 without writing
  OUT.iso when there are errors; --cloud-init-version and
  --cloud-init-schemas choose the schemas, as for 'vmseed lint'.

  F may be '-' for stdin (at most one). Without --meta-data, meta-data is
  {"instance-id": "iid-local01"} (nocloud, like cloud-localds) or
  {"uuid": "iid-local01"} (configdrive). meta-data may be JSON or YAML (a
  mapping); it is checked and written as given, byte for byte, except a YAML
  file for configdrive, whose meta_data.json must be JSON (written as compact
  JSON). SOURCE_DATE_EPOCH fixes the timestamp.
`;

/**
 * `vmseed build`'s flags: one table for every mode, so a new mode adds its
 * options beside these.
 */
export const BUILD_OPTIONS = {
  // No default here: the files mode defaults to nocloud, a VMI mode takes it
  // from the VMI unless given.
  datasource: { type: 'string' },
  'user-data': { type: 'string' },
  'meta-data': { type: 'string' },
  'network-config': { type: 'string' },
  'vendor-data': { type: 'string' },
  output: { type: 'string', short: 'o' },
  vmi: { type: 'string' },
  objects: { type: 'string', multiple: true },
  'vendor-data-from': { type: 'string' },
  'domain-xml': { type: 'string' },
  lint: { type: 'boolean' },
  ...SCHEMA_OPTIONS,
  help: { type: 'boolean', short: 'h' },
} as const satisfies ParseArgsConfig['options'];

/** The parsed flags of `vmseed build`. */
export type BuildValues = ReturnType<typeof parseBuildArgs>['values'];

/**
 * Parses `vmseed build`'s arguments; throws UsageError on an unknown or
 * malformed flag.
 */
export function parseBuildArgs(argv: string[]) {
  try {
    return parseArgs({ args: argv, options: BUILD_OPTIONS, strict: true, allowPositionals: false });
  } catch (e) {
    throw new UsageError((e as Error).message);
  }
}

/**
 * Reads a file argument (relative to the context's cwd); '-' is stdin, which can
 * be consumed once. Throws UsageError when the file cannot be read.
 */
export class InputReader {
  readonly ctx: CliContext;
  #stdinUsedBy: string | undefined;

  constructor(ctx: CliContext) {
    this.ctx = ctx;
  }

  async read(option: string, file: string): Promise<Uint8Array> {
    if (file === '-') {
      if (this.#stdinUsedBy) throw new UsageError(`--${option} -: stdin is already used by --${this.#stdinUsedBy}`);
      this.#stdinUsedBy = option;
      const chunks: Buffer[] = [];
      for await (const c of this.ctx.stdin) chunks.push(Buffer.isBuffer(c) ? c : Buffer.from(c as string));
      return new Uint8Array(Buffer.concat(chunks));
    }
    try {
      return new Uint8Array(await readFile(resolve(this.ctx.cwd, file)));
    } catch (e) {
      throw new UsageError(`--${option} ${file}: cannot read it (${(e as { code?: string }).code ?? 'error'})`);
    }
  }
}

function isJsonText(bytes: Uint8Array): boolean {
  try {
    JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(bytes));
    return true;
  } catch {
    return false;
  }
}

function parseMetaData(bytes: Uint8Array): Record<string, unknown> {
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch {
    throw new VmseedError(
      'METADATA_INVALID',
      '--meta-data: not UTF-8 text; it must be a JSON or YAML mapping such as {"instance-id": "iid-local01"}',
      { field: 'meta-data' },
    );
  }
  // The agent's budgeted loader: an alias bomb or a deep nest is refused
  // (YAML_TOO_COMPLEX) before anything is built.
  const parsed = parseYaml(text, { field: 'meta-data' });
  if (!parsed.ok) {
    throw new VmseedError(
      'METADATA_INVALID',
      `--meta-data: not valid JSON or YAML (${where(parsed)}: ${parsed.reason}); it must be a mapping such as {"instance-id": "iid-local01"}`,
      { field: 'meta-data' },
    );
  }
  const v = parsed.value;
  // An empty file (or only comments) is no mapping either: without an
  // instance-id cloud-init cannot tell one boot's seed from the next.
  if (v === null || v === undefined) {
    throw new VmseedError(
      'METADATA_INVALID',
      '--meta-data: the file holds no mapping (empty or only comments); give one such as {"instance-id": "iid-local01"}, or leave out --meta-data for that default',
      { field: 'meta-data' },
    );
  }
  if (typeof v !== 'object' || Array.isArray(v)) {
    throw new VmseedError(
      'METADATA_INVALID',
      '--meta-data: must be a mapping of keys to values, such as {"instance-id": "iid-local01"}',
      { field: 'meta-data' },
    );
  }
  return v as Record<string, unknown>;
}

/**
 * The files mode: the seed from --user-data (required) and the optional
 * --meta-data, --network-config and --vendor-data. user-data gets the lint
 * --vmi's does (USERDATA_NO_HEADER warning, USERDATA_CLOUDCONFIG_INVALID).
 * Throws UsageError, or METADATA_INVALID for meta-data that is not a mapping.
 */
export async function seedFromFiles(values: BuildValues, datasource: Datasource, input: InputReader): Promise<Seed> {
  const userFile = values['user-data'];
  if (userFile === undefined) throw new UsageError('--user-data is required (use an empty file for none)');
  const userData = await input.read('user-data', userFile);
  // The agent's lint, as --vmi runs it: an empty file is "no user-data".
  const warnings = userData.length > 0 ? lintUserData(userData, 'user-data') : [];
  let seed: Seed;
  if (values['meta-data'] === undefined) {
    const metaData = datasource === 'configdrive' ? { uuid: 'iid-local01' } : { 'instance-id': 'iid-local01' };
    seed = { datasource, metaData, userData, warnings };
  } else {
    // Like cloud-localds: the user's file as given (comments, key order),
    // once it is known to be a mapping cloud-init can read.
    const raw = await input.read('meta-data', values['meta-data']);
    const metaData = parseMetaData(raw);
    const keep = datasource === 'nocloud' || isJsonText(raw);
    seed = { datasource, metaData, userData, warnings, ...(keep ? { metaDataRaw: raw } : {}) };
  }
  if (values['network-config'] !== undefined)
    seed.networkConfig = await input.read('network-config', values['network-config']);
  if (values['vendor-data'] !== undefined) seed.vendorData = await input.read('vendor-data', values['vendor-data']);
  return seed;
}

const FILE_MODE_OPTIONS = ['user-data', 'meta-data', 'network-config', 'vendor-data', 'datasource'] as const;

/**
 * The VMI mode: the same renderSeed the agent runs, over manifests on disk.
 * KubeVirt volumes are read (`own`): with no cluster nothing else builds them.
 * Throws UsageError for file-mode flags or not exactly one VMI.
 */
export async function seedFromVmi(values: BuildValues, input: InputReader): Promise<{ seed: Seed; timestamp: Date }> {
  for (const o of FILE_MODE_OPTIONS) {
    if (values[o] !== undefined) throw new UsageError(`--${o} cannot be combined with --vmi: the VMI defines its seed`);
  }
  const text = (option: string, file: string) => input.read(option, file).then((b) => new TextDecoder().decode(b));
  const vmiFile = values.vmi!;
  const parts = [parseManifests(await text('vmi', vmiFile), vmiFile)];
  for (const f of values.objects ?? []) parts.push(parseManifests(await text('objects', f), f));
  const objects = mergeManifests(parts);
  if (objects.vmis.length !== 1) {
    throw new UsageError(
      `--vmi ${vmiFile}: expected exactly one VirtualMachineInstance or VirtualMachine, found ${objects.vmis.length}`,
    );
  }
  const vmi = objects.vmis[0];
  const refs = new OneShotResolver(
    new MemoryResolver({ secrets: objects.secrets, configMaps: objects.configMaps }),
    vmiFile,
  );
  let defaultVendorData;
  if (values['vendor-data-from'] !== undefined) {
    try {
      defaultVendorData = parseVendorDataFrom(values['vendor-data-from']);
    } catch (e) {
      throw new UsageError((e as Error).message);
    }
  }
  let domainDevices;
  if (values['domain-xml'] !== undefined) {
    domainDevices = domainDevicesFromXml(await text('domain-xml', values['domain-xml']));
    if (domainDevices === undefined)
      throw new UsageError(
        `--domain-xml ${values['domain-xml']}: not a libvirt <domain> XML (as virsh dumpxml prints it)`,
      );
  }
  const outcome = await renderSeed(
    vmi,
    refs,
    { ...DEFAULT_RENDER_OPTIONS, kubevirtVolumes: 'own', ...(defaultVendorData ? { defaultVendorData } : {}) },
    domainDevices ? { domainDevices } : {},
  ).catch((e: unknown) => {
    throw refs.explain(e);
  });
  if (outcome.kind === 'skip') {
    const code = outcome.warning ? `${outcome.warning.code}: ` : '';
    throw new UsageError(`--vmi ${vmiFile}: ${code}${outcome.reason}`);
  }
  return { seed: outcome.seed, timestamp: seedTimestamp(vmi) };
}

// The agent's fix for a missing Secret or ConfigMap is to create it in the
// cluster and wait; a one-shot build reads no cluster, so its fix is a file.
class OneShotResolver implements RefResolver {
  readonly #inner: RefResolver;
  readonly #vmiFile: string;
  readonly #missing: string[] = [];

  constructor(inner: RefResolver, vmiFile: string) {
    this.#inner = inner;
    this.#vmiFile = vmiFile;
  }

  async getSecret(namespace: string, name: string) {
    const s = await this.#inner.getSecret(namespace, name);
    if (s === undefined) this.#missing.push(`Secret ${namespace}/${name}`);
    return s;
  }

  async getConfigMap(namespace: string, name: string) {
    const c = await this.#inner.getConfigMap(namespace, name);
    if (c === undefined) this.#missing.push(`ConfigMap ${namespace}/${name}`);
    return c;
  }

  explain(e: unknown): unknown {
    if (!(e instanceof VmseedError) || (e.code !== 'SECRET_NOT_FOUND' && e.code !== 'CONFIGMAP_NOT_FOUND')) return e;
    const what = this.#missing.at(-1) ?? 'a referenced object';
    return new VmseedError(
      e.code,
      `${what} (${e.field ?? 'referenced by the VMI'}) is in neither ${this.#vmiFile} nor an --objects file; ` +
        `a build reads no cluster: export it (kubectl get -o yaml) and pass the file with --objects FILE`,
      { kind: 'terminal', ...(e.field !== undefined ? { field: e.field } : {}) },
    );
  }
}

function timestampFrom(env: NodeJS.ProcessEnv): Date {
  const epoch = env.SOURCE_DATE_EPOCH;
  if (epoch !== undefined && /^\d+$/.test(epoch)) return new Date(Number(epoch) * 1000);
  return new Date();
}

// The output replaces OUT atomically, so a VM pointed at it never reads half.
async function writeOutput(path: string, bytes: Uint8Array): Promise<void> {
  const tmp = join(dirname(path), `.${basename(path)}.tmp-${process.pid}`);
  try {
    await writeFile(tmp, bytes, { mode: 0o644 });
    await rename(tmp, path);
  } catch (e) {
    await unlink(tmp).catch(() => {});
    throw e;
  }
}

// -o naming a directory is a bad invocation (2), found before any work;
// anything else (a missing parent, EACCES) shows at the write (1).
async function checkOutput(path: string, given: string): Promise<void> {
  const st = await stat(path).catch(() => undefined);
  if (st?.isDirectory()) throw new UsageError(`-o ${given}: is a directory; give the image file's path`);
}

/**
 * `vmseed build`: writes the seed image to -o atomically. Exit 2 on bad input or
 * usage (unknown flag, unreadable input, -o a directory, input that does not
 * validate), 1 when the work fails (the output cannot be written).
 */
export const build: Command = async (ctx): Promise<ExitCode> => {
  let values: BuildValues;
  let seed: Seed;
  let timestamp: Date;
  try {
    values = parseBuildArgs(ctx.argv).values;
    if (values.help) {
      ctx.stdout.write(BUILD_USAGE);
      return 0;
    }
    const datasource = values.datasource as Datasource | undefined;
    if (datasource !== undefined && !DATASOURCES.includes(datasource)) {
      throw new UsageError(`--datasource: '${values.datasource}' is not one of ${DATASOURCES.join(', ')}`);
    }
    if (values.output === undefined) throw new UsageError('-o OUT.iso is required');
    let target: SchemaTarget | undefined;
    if (values.lint) target = schemaTarget(values, ctx.cwd);
    else {
      for (const o of Object.keys(SCHEMA_OPTIONS))
        if (values[o as keyof typeof SCHEMA_OPTIONS] !== undefined) throw new UsageError(`--${o} goes with --lint`);
    }
    await checkOutput(resolve(ctx.cwd, values.output), values.output);
    const input = new InputReader(ctx);
    if (values.vmi !== undefined) {
      ({ seed, timestamp } = await seedFromVmi(values, input));
    } else {
      if (values.objects !== undefined) throw new UsageError('--objects goes with --vmi');
      if (values['vendor-data-from'] !== undefined) throw new UsageError('--vendor-data-from goes with --vmi');
      if (values['domain-xml'] !== undefined) throw new UsageError('--domain-xml goes with --vmi');
      seed = await seedFromFiles(values, datasource ?? 'nocloud', input);
      timestamp = timestampFrom(ctx.env);
    }
    // --lint reports a missing header itself, as an error.
    for (const w of seed.warnings) {
      if (target && w.code === 'USERDATA_NO_HEADER') continue;
      ctx.stderr.write(`vmseed build: warning: ${w.code}: ${w.message}\n`);
    }
    if (target && !lintSeed(ctx, values, seed, target)) {
      ctx.stderr.write(`vmseed build: --lint found errors; ${values.output} not written\n`);
      return 2;
    }
  } catch (e) {
    return fail(ctx, e);
  }
  let image;
  try {
    image = buildSeedImage(seed, timestamp);
  } catch (e) {
    return fail(ctx, e);
  }
  const out = resolve(ctx.cwd, values.output);
  try {
    await writeOutput(out, image.bytes);
  } catch (e) {
    ctx.stderr.write(`vmseed build: cannot write ${values.output} (${(e as { code?: string }).code ?? 'error'})\n`);
    return 1;
  }
  ctx.stdout.write(
    `${values.output}: ${image.label}, ${image.bytes.length} bytes, ${image.files.map((f) => `${f.path} (${f.size})`).join(', ')}, sha256 ${image.sha256}\n`,
  );
  return 0;
};

// --lint: the seed's documents checked as `vmseed lint` checks them, the
// lines on stderr; false when any has errors. ConfigDrive's vendor_data.json
// and network_data.json are OpenStack's formats, which cloud-init's schemas
// do not describe.
function lintSeed(ctx: CliContext, values: BuildValues, seed: Seed, target: SchemaTarget): boolean {
  const label = (option: 'user-data' | 'vendor-data' | 'network-config') => {
    if (values.vmi !== undefined) return `${values.vmi} ${option}`;
    const file = values[option];
    return file === undefined || file === '-' ? `<stdin>` : file;
  };
  const docs: Array<['user-data' | 'vendor-data' | 'network-config', Uint8Array | undefined]> = [
    ['user-data', seed.userData],
  ];
  if (seed.datasource === 'nocloud') {
    docs.push(['vendor-data', seed.vendorData], ['network-config', seed.networkConfig]);
  }
  let ok = true;
  for (const [type, bytes] of docs) {
    if (bytes === undefined) continue;
    const result = lintDocument(label(type), type, bytes, target);
    for (const line of lintLines(result)) ctx.stderr.write(`${line}\n`);
    if (lintFails(result)) ok = false;
  }
  return ok;
}

function fail(ctx: CliContext, e: unknown): ExitCode {
  if (e instanceof SchemasMissingError) {
    ctx.stderr.write(`vmseed build: ${e.message}\n`);
    return 1;
  }
  if (e instanceof UsageError || e instanceof VmseedError) {
    const prefix = e instanceof VmseedError ? `${e.code}: ` : '';
    ctx.stderr.write(`vmseed build: ${prefix}${e.message}\n`);
    return 2;
  }
  // Not the input's fault: the work failed.
  ctx.stderr.write(`vmseed build: ${(e as Error)?.message ?? String(e)}\n`);
  return 1;
}

export default build;
