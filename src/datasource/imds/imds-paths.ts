// Which request paths the KubeVirt IMDS endpoints answer, beside the NoCloud
// files (datasource-path.ts). IMDS serves `/v1/identity`, `/v1/token` and
// `/openstack/...` to whoever reaches its sidecar; here the same paths are
// answered by source address (IMDS-annotated VMIs), and a per-VM token form
// `<prefix>/<token>/identity`, `<prefix>/<token>/token`,
// `<prefix>/<token>/openstack/...` serves VMIs whose guests hold a token
// serial. Matching is byte for byte on the raw target, like the NoCloud
// paths: no decoding, no normalisation, no query string.
import { TOKEN_LENGTH, isTokenShaped } from '../tokens.ts';

// Bounded label set for metrics.
// `session`: `PUT <prefix>/session`, answered only with --datasource-imds-session.
export const IMDS_FAMILIES = ['identity', 'token', 'openstack', 'session'] as const;
export type ImdsFamily = (typeof IMDS_FAMILIES)[number];

/** The OpenStack tree as cloud-init's MetadataReader and cloudbase-init walk it. */
export const OPENSTACK_FILES = ['meta_data.json', 'user_data', 'network_data.json', 'vendor_data.json'] as const;
export type OpenstackFile = (typeof OPENSTACK_FILES)[number];
/** A parsed `/openstack...` path: the version list, the `latest/` listing, or one file. */
export type OpenstackPath = { kind: 'versions' } | { kind: 'listing' } | { kind: 'file'; file: OpenstackFile };

export type ImdsCaller = { via: 'address' } | { via: 'token'; token: string };

export type ImdsRoute = ImdsCaller &
  (
    | { family: 'identity' }
    | { family: 'token' }
    | { family: 'session' }
    | { family: 'openstack'; openstack: OpenstackPath }
  );

function openstackPath(rest: string): OpenstackPath | undefined {
  if (rest === '/openstack' || rest === '/openstack/') return { kind: 'versions' };
  if (rest === '/openstack/latest' || rest === '/openstack/latest/') return { kind: 'listing' };
  const file = rest.startsWith('/openstack/latest/') ? rest.slice('/openstack/latest/'.length) : undefined;
  return file !== undefined && (OPENSTACK_FILES as readonly string[]).includes(file)
    ? { kind: 'file', file: file as OpenstackFile }
    : undefined;
}

// What follows the caller part: `/identity`, `/token`, `/session` or `/openstack...`.
function endpoint(rest: string, caller: ImdsCaller): ImdsRoute | undefined {
  if (rest === '/identity') return { ...caller, family: 'identity' };
  if (rest === '/token') return { ...caller, family: 'token' };
  if (rest === '/session') return { ...caller, family: 'session' };
  const openstack = openstackPath(rest);
  return openstack && { ...caller, family: 'openstack', openstack };
}

// `prefix` normalised (no trailing slash). Undefined: not an IMDS path.
export function parseImdsPath(target: string, prefix: string): ImdsRoute | undefined {
  // IMDS's OpenStack tree sits at the root, outside /v1.
  if (target.startsWith('/openstack')) return openstackPath(target) && endpoint(target, { via: 'address' });
  if (!target.startsWith(`${prefix}/`)) return undefined;
  const rest = target.slice(prefix.length);
  const byAddress = endpoint(rest, { via: 'address' });
  if (byAddress !== undefined && byAddress.family !== 'openstack') return byAddress;
  const token = rest.slice(1, 1 + TOKEN_LENGTH);
  if (!isTokenShaped(token)) return undefined;
  return endpoint(rest.slice(1 + TOKEN_LENGTH), { via: 'token', token });
}
