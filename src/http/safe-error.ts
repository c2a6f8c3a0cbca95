// What of an error the agent's HTTP listener may log.
import { VmseedError } from '../errors.ts';

// Stack frames only: the first line of a stack is the message, which for a
// foreign error may quote user input.
export function safeErrorForLog(e: unknown): Record<string, unknown> {
  if (e instanceof VmseedError) return { code: e.code, message: e.message };
  if (e instanceof Error) return { type: e.name, stack: (e.stack ?? '').split('\n').slice(1).join('\n') };
  return { type: typeof e };
}
