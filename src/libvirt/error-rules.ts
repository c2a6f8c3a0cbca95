// The one table of libvirt error messages both libvirt clients classify
// with: the virsh runner (virsh/runner.ts) and the RPC client
// (rpc/remote-error.ts). It sits below both so neither borrows the other's.
import type { ErrorCode, ErrorKind } from '../errors.ts';

/** One rule: a message pattern and the code, kind and hint it maps to. */
export interface LibvirtErrorRule {
  test: RegExp;
  code: ErrorCode;
  kind: ErrorKind;
  hint: string;
}

/**
 * libvirt's error messages to vmseed's codes, in order, for both clients:
 * virsh's `error:` lines (LC_ALL=C) and the RPC client's remote_error
 * messages where libvirt has no precise numeric code.
 */
// Sources: libvirt's messages (src/qemu/qemu_hotplug.c,
// src/conf/domain_conf.c, docs/manpages/virsh.rst), each one checked as
// virsh 9.0 printed it.
export const LIBVIRT_ERROR_RULES: LibvirtErrorRule[] = [
  {
    test: /failed to connect to the hypervisor|Failed to connect socket/,
    code: 'LIBVIRT_UNREACHABLE',
    kind: 'retryable',
    hint: 'libvirtd does not answer on this URI (not started yet, or a wrong URI template); will retry',
  },
  {
    test: /failed to get domain '|Domain not found/,
    code: 'DOMAIN_NOT_FOUND',
    kind: 'retryable',
    hint: 'the domain is not defined yet; will retry',
  },
  {
    test: /target '?\S+?'? duplicated|target \S+ already exists/,
    code: 'TARGET_IN_USE',
    kind: 'retryable',
    hint: 'another disk uses that target (or a detach is still pending); will retry',
  },
  {
    test: /non unique alias detected/,
    code: 'ALIAS_IN_USE',
    kind: 'retryable',
    hint: 'a disk with our alias is already there (or a detach is still pending); will retry',
  },
  {
    test: /Cannot access storage file/,
    code: 'SEED_FILE_NOT_ACCESSIBLE',
    kind: 'retryable',
    hint: 'libvirt cannot open the seed image; check the image path template and that the image directory is mounted where the domain runs',
  },
  {
    test: /transient domains do not have any persistent config/,
    code: 'DOMAIN_TRANSIENT',
    kind: 'terminal',
    hint: 'the domain is transient; do not use --config on it',
  },
  {
    test: /device not found|no device found with alias/,
    code: 'DEVICE_NOT_FOUND',
    kind: 'retryable',
    hint: 'the disk is not on the domain',
  },
];
