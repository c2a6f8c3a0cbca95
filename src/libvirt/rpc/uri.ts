// A libvirt URI to the unix socket to dial and the name to open on it, the
// way libvirt's remote driver does it for the URIs vmseed uses:
//   qemu:///system                          -> the system daemon's socket
//   qemu:///session                         -> $XDG_RUNTIME_DIR/libvirt/…
//   qemu+unix:///session?socket=/path/sock  -> that socket, opening qemu:///session
// The transport and the `socket` parameter are for the client; the daemon
// only sees `driver:///path`.
import { existsSync } from 'node:fs';
import { isAbsolute, join } from 'node:path';
import { VmseedError } from '../../errors.ts';

export interface SocketTarget {
  socketPath: string;
  name: string;
}

export interface ResolveOptions {
  // Which sockets exist (tests pass a fake); default: the file system.
  exists?: (path: string) => boolean;
  runtimeDir?: string | undefined;
}

const SYSTEM_SOCKETS = ['/run/libvirt/virtqemud-sock', '/run/libvirt/libvirt-sock'];

function invalid(uri: string, why: string): VmseedError {
  return new VmseedError(
    'CONFIG_INVALID',
    `libvirt URI '${uri}' ${why}; use qemu:///system, qemu:///session or qemu+unix:///session?socket=/path`,
    { kind: 'terminal', field: 'uri' },
  );
}

/**
 * The socket to dial and the URI to open on it, as libvirt's remote driver
 * picks them. Throws VmseedError CONFIG_INVALID (terminal) for a URI the RPC
 * client cannot dial (not local qemu, another parameter than `socket`).
 */
export function resolveUri(uri: string, o: ResolveOptions = {}): SocketTarget {
  const exists = o.exists ?? existsSync;
  const m = /^(qemu)(?:\+unix)?:\/\/\/(system|session)(?:\?(.*))?$/.exec(uri);
  if (!m) throw invalid(uri, 'is not a local qemu URI the RPC client can dial');
  const [, driver, mode, query] = m;
  const name = `${driver}:///${mode}`;
  let socket: string | undefined;
  if (query !== undefined) {
    for (const [k, v] of new URLSearchParams(query)) {
      if (k !== 'socket') throw invalid(uri, `has parameter '${k}', which the RPC client does not support`);
      socket = v;
    }
    if (socket === undefined || !isAbsolute(socket) || socket.includes('\0'))
      throw invalid(uri, 'needs an absolute socket path');
    return { socketPath: socket, name };
  }
  if (mode === 'system') {
    // Modular daemons (virtqemud) first, like libvirt's client; Debian 12
    // ships only the monolithic libvirtd.
    return { socketPath: SYSTEM_SOCKETS.find((s) => exists(s)) ?? SYSTEM_SOCKETS[SYSTEM_SOCKETS.length - 1], name };
  }
  const runtime = o.runtimeDir ?? process.env.XDG_RUNTIME_DIR;
  if (!runtime) throw invalid(uri, 'needs XDG_RUNTIME_DIR or a socket= parameter');
  const candidates = [join(runtime, 'libvirt', 'virtqemud-sock'), join(runtime, 'libvirt', 'libvirt-sock')];
  return { socketPath: candidates.find((s) => exists(s)) ?? candidates[1], name };
}

/**
 * Whether the RPC client dials `uriTemplate` itself (a local qemu URI; ssh,
 * tls and tcp need virsh), and its raw `socket=` value when it has one
 * (still percent-encoded, possibly with {placeholders}).
 */
export function localUriSocket(uriTemplate: string): { socket: string | undefined } | undefined {
  const m = /^qemu(?:\+unix)?:\/\/\/(?:system|session)(?:\?socket=([^&]+))?$/.exec(uriTemplate);
  return m ? { socket: m[1] } : undefined;
}
