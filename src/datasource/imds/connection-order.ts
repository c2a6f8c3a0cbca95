// Which request of its connection a request is. `PUT /v1/session` is
// answered only as the first request of a connection: the redirect's hop
// limit (src/redirect/nft-ruleset.ts, --session-hop-limit) decides a
// connection's fate by its first bytes, before any answer, and a PUT
// pipelined or kept alive behind a GET would ride a connection already
// judged plain, its answer crossing every hop. Counted for every request
// the listener reads (the outermost handler calls noteRequest), reports and
// refusals included.
import type { IncomingMessage } from 'node:http';
import type { Socket } from 'node:net';

// Weak: a socket's count goes with the socket.
const seen = new WeakMap<Socket, number>();

/** Counts `req` on its connection; called once per request, before anything else. */
export function noteRequest(req: IncomingMessage): void {
  seen.set(req.socket, (seen.get(req.socket) ?? 0) + 1);
}

/** Whether `req` is the first request its connection carried (true when not counted). */
export function firstOnConnection(req: IncomingMessage): boolean {
  return (seen.get(req.socket) ?? 1) === 1;
}
