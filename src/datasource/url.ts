// What guests are pointed at: the per-VMI seed URL on the NoCloud HTTP
// datasource and the DMI serial (`ds=nocloud;s=...`) that carries it.
import { VmseedError } from '../errors.ts';
import type { DatasourceKeyring } from './tokens.ts';

/** The seed base guests are pointed at unless configured: IMDS's link-local address. */
export const DEFAULT_DATASOURCE_BASE = 'http://169.254.169.254/v1';

/**
 * `nocloud` is what cloud-init 23.2+ wants (an http seed switches it to
 * network mode itself). Guests with older cloud-init need `nocloud-net` for
 * an http seed; it is deprecated since 24.1 but still honoured.
 */
export type SerialDatasourceId = 'nocloud' | 'nocloud-net';

/**
 * The seed URL of one VMI: base + `/` + token + `/`. Always with the
 * trailing slash, so cloud-init before 23.1 (which appends file names raw)
 * and after (which adds a slash only when missing) request the same paths.
 * Throws VmseedError DATASOURCE_URL_INVALID for a base cloud-init would misread.
 */
export function datasourceSeedUrl(base: string, token: string): string {
  let url: URL;
  try {
    url = new URL(base);
  } catch {
    throw new VmseedError(
      'DATASOURCE_URL_INVALID',
      `datasource base URL '${base}' is not a URL; use e.g. ${DEFAULT_DATASOURCE_BASE}`,
      { field: 'base' },
    );
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new VmseedError(
      'DATASOURCE_URL_INVALID',
      `datasource base URL must be http:// or https://, got ${url.protocol}`,
      { field: 'base' },
    );
  }
  // `;` and whitespace end the value in cloud-init's `ds=` line parser, a
  // query or fragment would have the file names appended after it, and `%s`
  // is a substitution marker to read_seeded.
  if (/[;\s]|%s/.test(base) || url.search !== '' || url.hash !== '' || url.username !== '' || url.password !== '') {
    throw new VmseedError(
      'DATASOURCE_URL_INVALID',
      `datasource base URL '${base}' must not contain ';', whitespace, '%s', credentials, a query or a fragment`,
      { field: 'base' },
    );
  }
  return `${base.replace(/\/+$/, '')}/${token}/`;
}

/** The DMI serial that points cloud-init at `seedUrl`: `ds=<ds>;s=<seedUrl>`. */
export function datasourceSerial(seedUrl: string, ds: SerialDatasourceId = 'nocloud'): string {
  return `ds=${ds};s=${seedUrl}`;
}

const SERIAL_TOKEN_RE = /\/([A-Za-z0-9_-]{43})\/$/;

/**
 * The token of a NoCloud DMI serial (`ds=nocloud;s=<base>/<token>/`, or
 * `ds=nocloud-net`, any base, `seedfrom=` as cloud-init reads it too), or
 * undefined when the serial is none or its seed URL does not end in
 * `/<token>/`.
 */
export function serialToken(serial: unknown): string | undefined {
  if (typeof serial !== 'string') return undefined;
  const [ds, ...fields] = serial.split(';');
  if (ds !== 'ds=nocloud' && ds !== 'ds=nocloud-net') return undefined;
  let found: string | undefined;
  for (const f of fields) {
    const eq = f.indexOf('=');
    const k = f.slice(0, eq);
    if (eq < 0 || (k !== 's' && k !== 'seedfrom')) continue;
    // Two seed URLs: which one cloud-init follows is not ours to guess.
    if (found !== undefined) return undefined;
    found = SERIAL_TOKEN_RE.exec(f.slice(eq + 1))?.[1] ?? '';
  }
  return found === '' ? undefined : found;
}

// What the status page shows for a VMI: the serial string to paste.
export function datasourceSerialFor(
  keyring: DatasourceKeyring,
  uid: string,
  base: string = DEFAULT_DATASOURCE_BASE,
  ds: SerialDatasourceId = 'nocloud',
): string {
  return datasourceSerial(datasourceSeedUrl(base, keyring.sign(uid)), ds);
}
