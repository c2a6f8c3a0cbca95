// Which request paths the NoCloud HTTP datasource answers.
//
// cloud-init builds each URL from the seed base (`s=` of the DMI serial or
// kernel cmdline) in util.read_seeded:
//   - before 23.1 (e.g. Debian 12's 22.4): base + name, raw. So
//       s=http://h/v1/<token>/  ->  /v1/<token>/meta-data
//       s=http://h/v1/<token>   ->  /v1/<token>meta-data
//   - 23.1 and later (features.NOCLOUD_SEED_URL_APPEND_FORWARD_SLASH): a
//     `/` is appended when the base has neither a trailing slash nor a
//     query string, so both forms above request /v1/<token>/meta-data.
//   - a base containing `%s` has the name substituted; `.../<token>/%s`
//     gives the same paths.
// Files fetched: meta-data, user-data, vendor-data (22.x); 24.3 added
// network-config, fetched first. The token has a fixed length, so
// `<prefix>/<token><name>` is unambiguous.
//
// Matching is on the raw request target, byte for byte, with no percent
// decoding and no path normalisation: tokens and names are plain ASCII, so
// `%2e%2e`, `..`, doubled slashes, encoded slashes and the like can never
// match anything and all end up as 404. A query string is not accepted
// (cloud-init only sends one when the operator put it in the base URL,
// which `vmseed seed-url` never does).
import { isDatasourceFile, type DatasourceFile } from './files.ts';
import { TOKEN_LENGTH, isTokenShaped } from './tokens.ts';

export type DatasourceRoute =
  | { kind: 'token'; token: string; file: DatasourceFile }
  // Opt-in compat mode only: `<prefix>/<file>` (or `<prefix><file>` from
  // pre-23.1 cloud-init with a base lacking its trailing slash).
  | { kind: 'compat'; file: DatasourceFile };

/**
 * The datasource path prefix without trailing slashes (`/v1/` -> `/v1`).
 * Throws RangeError, worded for the CLI, unless it is empty or `/`-separated
 * segments of URL-unreserved characters.
 */
export function normalisePrefix(prefix: string): string {
  const p = prefix.replace(/\/+$/, '');
  if (p !== '' && !/^(\/[A-Za-z0-9._~-]+)+$/.test(p)) {
    throw new RangeError(`datasource prefix '${prefix}' must be empty or like /v1 (letters, digits, . _ ~ -)`);
  }
  return p;
}

// `prefix` must already be normalised (no trailing slash).
export function parseDatasourcePath(target: string, prefix: string): DatasourceRoute | undefined {
  if (!target.startsWith(prefix)) return undefined;
  let rest = target.slice(prefix.length);
  if (isDatasourceFile(rest)) return { kind: 'compat', file: rest };
  if (!rest.startsWith('/')) return undefined;
  rest = rest.slice(1);
  if (isDatasourceFile(rest)) return { kind: 'compat', file: rest };
  const token = rest.slice(0, TOKEN_LENGTH);
  if (!isTokenShaped(token)) return undefined;
  let name = rest.slice(TOKEN_LENGTH);
  if (name.startsWith('/')) name = name.slice(1);
  if (!isDatasourceFile(name)) return undefined;
  return { kind: 'token', token, file: name };
}

// The endpoint label for metrics: a file name, `imds` for IMDS's paths
// (vmseed_imds_requests_total has their families), or `other`.
export function endpointLabel(route: DatasourceRoute | undefined, imds = false): DatasourceFile | 'imds' | 'other' {
  return route?.file ?? (imds ? 'imds' : 'other');
}
