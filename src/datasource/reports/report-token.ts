// The credential a guest's cloud-init posts its progress events with: an
// HMAC of the VMI's UID under the datasource keyring, in a domain of its
// own. It must not be the seed token: cloud-init keeps its reporting
// configuration where the guest's own logs and instance data may show it,
// and a credential read there must not open the seed (which can hold
// passwords). The label holds a NUL, which no Kubernetes UID starts with,
// so no report token is the node's token of a UID; the seed's serial tokens
// are random, and report tokens are never looked up among them.
import type { DatasourceKeyring } from '../tokens.ts';

const LABEL = 'vmseed progress report\0';

// The last path segment events are posted to: `<base>/<token>/<REPORT_PATH_NAME>`.
export const REPORT_PATH_NAME = 'cloud-init-events';

export function reportMessage(uid: string): string {
  return `${LABEL}${uid}`;
}

/**
 * The report token of the VMI with this UID, under the signing key. Throws
 * VmseedError DATASOURCE_KEY_FILE_UNREADABLE while no key is loaded.
 */
export function reportToken(keyring: DatasourceKeyring, uid: string): string {
  return keyring.sign(reportMessage(uid));
}

/**
 * Where a guest posts its events. `base` as the datasource's (e.g.
 * http://169.254.169.254/v1), already checked by datasourceSeedUrl where the
 * seed URL is built.
 */
export function reportUrl(base: string, token: string): string {
  return `${base.replace(/\/+$/, '')}/${token}/${REPORT_PATH_NAME}`;
}
