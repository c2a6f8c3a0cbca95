// The render pool's worker thread (render-pool.ts): runs one step of
// src/cloudinit/pure-ops.ts per message, the same pure functions the agent
// runs inline for small documents.
import { parentPort } from 'node:worker_threads';
import { runPure, type PureArgs, type PureOpName } from '../cloudinit/pure-ops.ts';
import { installSchemaFiles } from '../cloudinit/schema/schema-store.ts';
import { readTextFileBounded } from '../core/bounded-file.ts';
import { VmseedError } from '../errors.ts';

export interface JobMessage {
  id: number;
  op: PureOpName;
  args: unknown[];
}

export type ReplyError =
  | { vmseed: true; code: VmseedError['code']; message: string; kind: VmseedError['kind']; field?: string }
  | { vmseed: false; name: string; message: string };

// The worker's first message: its modules are loaded.
export const READY = 'ready';

export type ReplyMessage = { id: number; ok: true; value: unknown } | { id: number; ok: false; error: ReplyError };

function describe(e: unknown): ReplyError {
  if (e instanceof VmseedError)
    return {
      vmseed: true,
      code: e.code,
      message: e.message,
      kind: e.kind,
      ...(e.field !== undefined ? { field: e.field } : {}),
    };
  // Not ours: the agent reports INTERNAL without the message (it may quote
  // input); the name and message go to the log only.
  return {
    vmseed: false,
    name: e instanceof Error ? e.name : typeof e,
    message: e instanceof Error ? e.message.slice(0, 200) : '',
  };
}

// Imported outside a worker (vmseed warm-cache loads every module), it does nothing.
const port = parentPort;
// A worker checks cloud-config against cloud-init's schemas (checkSchemas) with its own store.
if (port) installSchemaFiles({ read: readTextFileBounded });
port?.on('message', (job: JobMessage) => {
  let reply: ReplyMessage;
  try {
    reply = { id: job.id, ok: true, value: runPure(job.op, job.args as PureArgs<typeof job.op>) };
  } catch (e) {
    reply = { id: job.id, ok: false, error: describe(e) };
  }
  port.postMessage(reply);
});
port?.postMessage(READY);
