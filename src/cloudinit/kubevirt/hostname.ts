import type { VmiObject } from '../../api/objects.ts';

/**
 * The guest's hostname as KubeVirt's pkg/util/net/dns/sanitize.go gives it: spec.hostname wins;
 * otherwise the VMI name up to its first dot (a dotted name would read as an FQDN), at most 63
 * characters (one DNS label).
 */
export function hostname(vmi: VmiObject): string {
  const h = vmi.spec?.hostname;
  if (typeof h === 'string' && h !== '') return h;
  return vmi.metadata.name.split('.')[0].slice(0, 63);
}
