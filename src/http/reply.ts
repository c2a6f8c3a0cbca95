// What the agent's HTTP listener answers, and how it is written: every
// answer carries the same security headers and an exact length.
import type { ServerResponse } from 'node:http';
import { CONTENT_SECURITY_POLICY } from './status-page.ts';

export interface Reply {
  status: number;
  type: string;
  body: string | Buffer;
  headers?: Record<string, string>;
}

const SECURITY_HEADERS: Record<string, string> = {
  'content-security-policy': CONTENT_SECURITY_POLICY,
  'x-content-type-options': 'nosniff',
  'x-frame-options': 'DENY',
  'referrer-policy': 'no-referrer',
  'cross-origin-resource-policy': 'same-origin',
  'cache-control': 'no-store',
};

export const text = (status: number, body: string, headers?: Record<string, string>): Reply => ({
  status,
  type: 'text/plain; charset=utf-8',
  body,
  headers,
});
export const html = (status: number, body: string): Reply => ({ status, type: 'text/html; charset=utf-8', body });
export const json = (status: number, value: unknown): Reply => ({
  status,
  type: 'application/json; charset=utf-8',
  body: JSON.stringify(value, null, 2) + '\n',
});

export function writeReply(res: ServerResponse, reply: Reply, head: boolean): void {
  const body = typeof reply.body === 'string' ? Buffer.from(reply.body) : reply.body;
  res.writeHead(reply.status, {
    ...SECURITY_HEADERS,
    'content-type': reply.type,
    'content-length': String(body.length),
    ...reply.headers,
  });
  res.end(head ? undefined : body);
}
