// The URI a virsh process is given. A local URI's `socket=` path (a
// KubeVirt launcher's virtqemud-sock, in an emptyDir the launcher pod owns)
// is resolved by the agent to the socket's inode (libvirt/rpc/socket-hold.ts, the
// same walk as the RPC client's) and that descriptor is handed to virsh as
// its descriptor 3, with `socket=/proc/self/fd/3` in the URI: virsh given
// the name would follow a symlink the launcher swapped in to another pod's
// daemon, while the descriptor reaches the checked socket or nothing.
// Other URIs (no `socket=`, so libvirt's own root-owned paths; remote
// transports) go to virsh unchanged.
import { VmseedError } from '../../errors.ts';
import { holdForDial } from '../rpc/rpc-connection.ts';
import type { HeldSocket } from '../rpc/socket-hold.ts';

// After stdin, stdout and stderr.
export const CHILD_SOCKET_FD = 3;
export const CHILD_SOCKET_PATH = `/proc/self/fd/${CHILD_SOCKET_FD}`;

export interface VirshDial {
  uri: string;
  // Descriptors the child gets as 3, 4, ...
  fds: number[];
  // The socket path as configured, for messages that would name /proc.
  socketPath: string | undefined;
  close(): void;
}

function invalid(uri: string, why: string): VmseedError {
  return new VmseedError('CONFIG_INVALID', `libvirt URI '${uri}' ${why}; fix --libvirt-uri`, {
    kind: 'terminal',
    field: 'uri',
  });
}

// `driver[+unix]:///path?query`: no host, so the client dials a unix
// socket on this host.
const LOCAL_URI = /^[a-z][a-z0-9]*(?:\+unix)?:\/\/\/[^?#]*(?:\?([^#]*))?$/i;

export function dialForVirsh(uri: string, holder: (socketPath: string) => HeldSocket): VirshDial {
  const query = LOCAL_URI.exec(uri)?.[1];
  const params = query === undefined ? [] : query.split('&');
  const sockets = params.filter((p) => p.startsWith('socket='));
  if (sockets.length === 0) return { uri, fds: [], socketPath: undefined, close: () => {} };
  let socketPath: string;
  try {
    // libvirt reads the last one.
    socketPath = decodeURIComponent(sockets[sockets.length - 1].slice('socket='.length));
  } catch {
    throw invalid(uri, 'has a socket= path that is not valid percent-encoding');
  }
  if (!socketPath.startsWith('/') || socketPath.includes('\0')) throw invalid(uri, 'needs an absolute socket= path');
  const held = holdForDial(socketPath, holder);
  const others = params.filter((p) => !p.startsWith('socket='));
  return {
    uri: `${uri.slice(0, uri.indexOf('?'))}?${[...others, `socket=${CHILD_SOCKET_PATH}`].join('&')}`,
    fds: [held.fd],
    socketPath,
    close: () => held.close(),
  };
}
