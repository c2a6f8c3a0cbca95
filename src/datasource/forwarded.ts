// Requests that say they were forwarded are refused on every datasource
// path, as Azure's IMDS refuses X-Forwarded-For: the datasource answers the
// guest that sent the request, and a request relayed by a proxy inside the
// guest (or by anything else) is not that guest asking. cloud-init's
// url_helper and the clients KubeVirt IMDS documents (curl, PowerShell's
// Invoke-RestMethod, Python requests) send neither header; a guest whose
// HTTP proxy would relay 169.254.169.254 needs it in no_proxy, as on every
// cloud.
import type { IncomingMessage, ServerResponse } from 'node:http';

/** The headers refused, lower-case, as the reason label of the refusal counter. */
export const FORWARDING_HEADERS = ['x-forwarded-for', 'forwarded'] as const;
/** One of FORWARDING_HEADERS. */
export type ForwardingHeader = (typeof FORWARDING_HEADERS)[number];

const BODY = Buffer.from(
  'forwarded requests are refused (X-Forwarded-For or Forwarded present): ask 169.254.169.254 directly, not through a proxy\n',
);

/** The first forwarding header `req` carries, whatever its value (empty included), or undefined. */
export function forwardingHeader(req: IncomingMessage): ForwardingHeader | undefined {
  for (const name of FORWARDING_HEADERS) if (req.headers[name] !== undefined) return name;
  return undefined;
}

/**
 * Answers 400 with a fixed body that repeats nothing sent; a body not read
 * is not waited for: the connection goes once the answer is out.
 */
export function refuseForwarded(req: IncomingMessage, res: ServerResponse): void {
  res.writeHead(400, {
    'Cache-Control': 'no-store',
    'X-Content-Type-Options': 'nosniff',
    'Content-Type': 'text/plain; charset=utf-8',
    'Content-Length': String(BODY.byteLength),
    Connection: 'close',
  });
  res.end(req.method === 'HEAD' ? undefined : BODY);
  if (!req.complete) res.once('finish', () => req.destroy());
}
