// libvirt's remote_error (virErrorNumber code + message) to vmseed's codes.
// The numeric code decides where libvirt has a precise one (no such domain,
// no such device); otherwise libvirt's message goes through the same rules
// the virsh runner applies to virsh's `error:` lines, so both paths report
// the same code for the same failure.
import { VmseedError } from '../../errors.ts';
import { LIBVIRT_ERROR_RULES } from '../error-rules.ts';
import type { RemoteError } from './protocol.ts';

// virErrorNumber values (libvirt's include/libvirt/virterror.h).
export const VirErr = {
  INTERNAL_ERROR: 1,
  NO_SUPPORT: 3,
  OPERATION_FAILED: 9,
  XML_ERROR: 27,
  OPERATION_DENIED: 29,
  SYSTEM_ERROR: 38,
  RPC: 39,
  NO_DOMAIN: 42,
  AUTH_FAILED: 45,
  OPERATION_INVALID: 55,
  CONFIG_UNSUPPORTED: 67,
  OPERATION_TIMEOUT: 68,
  AUTH_CANCELLED: 79,
  ACCESS_DENIED: 88,
  AUTH_UNAVAILABLE: 94,
  DEVICE_MISSING: 99,
} as const;

const MESSAGE_MAX = 500;

export function mapRemoteError(e: RemoteError, operation: string): VmseedError {
  const text = (e.message ?? 'no error message').replace(/\s+/g, ' ').trim().slice(0, MESSAGE_MAX);
  const msg = (hint: string) => `libvirt ${operation}: ${text} (libvirt error ${e.code}); ${hint}`;
  switch (e.code) {
    case VirErr.NO_DOMAIN:
      return new VmseedError('DOMAIN_NOT_FOUND', msg('the domain is not defined yet; will retry'), {
        kind: 'retryable',
      });
    case VirErr.DEVICE_MISSING:
      return new VmseedError('DEVICE_NOT_FOUND', msg('the disk is not on the domain'), { kind: 'retryable' });
    case VirErr.AUTH_FAILED:
    case VirErr.AUTH_CANCELLED:
    case VirErr.AUTH_UNAVAILABLE:
    case VirErr.ACCESS_DENIED:
    case VirErr.OPERATION_DENIED:
      return new VmseedError(
        'LIBVIRT_ACCESS_DENIED',
        msg("libvirt refused this client; check the socket's owner and libvirtd's auth_unix_rw/access driver"),
        { kind: 'terminal' },
      );
    case VirErr.OPERATION_TIMEOUT:
      // e.g. "cannot acquire state change lock": another job holds the domain.
      return new VmseedError('LIBVIRT_TIMEOUT', msg('libvirt is busy with another job on this domain; will retry'), {
        kind: 'retryable',
      });
  }
  for (const r of LIBVIRT_ERROR_RULES) {
    if (r.test.test(text)) return new VmseedError(r.code, msg(r.hint), { kind: r.kind });
  }
  return new VmseedError('LIBVIRT_FAILED', msg('see the libvirtd log'), { kind: 'retryable' });
}
