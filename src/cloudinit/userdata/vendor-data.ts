// Vendor-data (KubeVirt #10343): per VMI (`vendorData`, `vendorDataFrom`) or
// the operator's default for every VMI (`--vendor-data-from ns/name`, a
// ConfigMap). The VMI's own replaces the default; `vendorData: ""` opts a VMI
// out of it. cloud-init processes vendor-data like user-data, below it
// (user-data wins, and users can disable it with `vendor_data: {enabled: false}`).
//
// NoCloud: the bytes as the `vendor-data` file. ConfigDrive: vendor_data.json,
// which cloud-init's DataSourceConfigDrive passes through
// sources.convert_vendordata: a JSON string is used as is, an object's
// "cloud-init" member is used. vmseed writes {"cloud-init": "<text>"}, the
// form Nova's vendordata providers use, so other members can sit beside it.
import { VmseedError } from '../../errors.ts';
import type { AnnotationExtras } from '../annotation/extras.ts';
import type { RefResolver, Datasource } from '../../api/objects.ts';
import { readObjectKey } from '../refs/object-refs.ts';
import type { SeedWarning } from '../seed.ts';
import { detectUserDataKind, lintUserData } from './user-data-lint.ts';

/** The key vendorDataFrom (and --vendor-data-from) reads when it names none. */
export const VENDORDATA_DEFAULT_KEY = 'vendor-data';

/** The operator's default vendor-data ConfigMap (`--vendor-data-from namespace/name[/key]`). */
export interface VendorDataRef {
  namespace: string;
  name: string;
  key?: string;
}

export const VENDOR_DATA_FLAG = '--vendor-data-from';

/**
 * The seed's vendor-data and the field it came from: the VMI's own (vendorData, vendorDataFrom),
 * else the operator's default; undefined for none or `vendorData: ""`. Throws readObjectKey's
 * errors (a missing object or key is retryable).
 */
export async function resolveVendorData(
  extras: AnnotationExtras | undefined,
  operatorDefault: VendorDataRef | undefined,
  namespace: string,
  refs: RefResolver,
  prefix: string,
): Promise<{ bytes: Uint8Array; field: string } | undefined> {
  if (extras?.vendorData !== undefined) {
    if (extras.vendorData === '') return undefined;
    return { bytes: new Uint8Array(Buffer.from(extras.vendorData, 'utf8')), field: `${prefix}.vendorData` };
  }
  if (extras?.vendorDataFrom) {
    const field = `${prefix}.vendorDataFrom`;
    return { bytes: await readObjectKey(refs, namespace, extras.vendorDataFrom, field, VENDORDATA_DEFAULT_KEY), field };
  }
  if (operatorDefault) {
    const field = VENDOR_DATA_FLAG;
    const ref = {
      kind: 'configmap' as const,
      name: operatorDefault.name,
      ...(operatorDefault.key ? { key: operatorDefault.key } : {}),
    };
    return { bytes: await readObjectKey(refs, operatorDefault.namespace, ref, field, VENDORDATA_DEFAULT_KEY), field };
  }
  return undefined;
}

function invalid(field: string, message: string): VmseedError {
  return new VmseedError('VENDORDATA_INVALID', `${field}: ${message}`, { kind: 'terminal', field });
}

/**
 * Lints vendor-data as user-data is linted: warnings become VENDORDATA_NO_HEADER, errors and a size
 * over `max` bytes a terminal VENDORDATA_INVALID. Pure (a PURE_OPS step).
 */
export function lintVendorData(bytes: Uint8Array, field: string, max: number): SeedWarning[] {
  if (bytes.length > max)
    throw invalid(
      field,
      `vendor-data is ${bytes.length} bytes, over the limit of ${max} bytes; shrink it or raise the limit`,
    );
  let warnings: SeedWarning[];
  try {
    warnings = lintUserData(bytes, field);
  } catch (e) {
    if (e instanceof VmseedError)
      throw invalid(field, e.message.replace(`${field}: `, '').replace('#cloud-config', 'vendor-data #cloud-config'));
    throw e;
  }
  return warnings.map((w) => ({
    code: 'VENDORDATA_NO_HEADER',
    field: w.field,
    message:
      'vendor-data does not start with a header cloud-init recognises (#cloud-config, #!, #include, MIME, gzip…); ' +
      'cloud-init will do nothing with it. Add "#cloud-config" as its first line',
  }));
}

/**
 * The vendor-data file's bytes: as given for NoCloud, `{"cloud-init": text}` for ConfigDrive.
 * Throws terminal VENDORDATA_INVALID for ConfigDrive vendor-data that is not UTF-8 text.
 */
export function vendorDataFile(bytes: Uint8Array, datasource: Datasource, field: string): Uint8Array {
  if (datasource === 'nocloud') return bytes;
  const { kind } = detectUserDataKind(bytes);
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch {
    throw invalid(
      field,
      `ConfigDrive's vendor_data.json is JSON text, so ${kind === 'unknown' ? 'binary' : 'gzip or binary'} vendor-data cannot go there; ` +
        'use plain text or datasource nocloud',
    );
  }
  return new Uint8Array(Buffer.from(JSON.stringify({ 'cloud-init': text }), 'utf8'));
}

/**
 * `--vendor-data-from namespace/name[/key]` → RenderOptions.defaultVendorData. Names follow
 * Kubernetes' DNS-1123 rules; keys ConfigMap key rules. Throws terminal CONFIG_INVALID otherwise.
 */
export function parseVendorDataFrom(value: string): VendorDataRef {
  const parts = value.split('/');
  const dns = /^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/;
  const key = /^[-._a-zA-Z0-9]{1,253}$/;
  if (
    (parts.length !== 2 && parts.length !== 3) ||
    !dns.test(parts[0]) ||
    !dns.test(parts[1]) ||
    (parts.length === 3 && !key.test(parts[2]))
  ) {
    throw new VmseedError(
      'CONFIG_INVALID',
      `${VENDOR_DATA_FLAG} must be <namespace>/<configmap>[/<key>] (e.g. vmseed-system/vendor-data); the key defaults to "${VENDORDATA_DEFAULT_KEY}"`,
      { kind: 'terminal', field: VENDOR_DATA_FLAG },
    );
  }
  return { namespace: parts[0], name: parts[1], ...(parts.length === 3 ? { key: parts[2] } : {}) };
}
