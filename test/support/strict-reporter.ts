// A node:test reporter that fails the run on any skipped, todo or cancelled
// test. node --test exits 0 on all three, so a test that stands aside for a
// missing tool, or one left as a placeholder, would pass a green run unseen.
// It only adds verdict lines; the display stays with the spec reporter that
// package.json's test scripts run beside it.

type Where = { name: string; file?: string; line?: number; skip?: unknown; todo?: unknown };
type Event =
  | { type: 'test:pass' | 'test:fail'; data: Where & { details?: { error?: { failureType?: string } } } }
  | { type: 'test:summary'; data: { file?: string; counts: Record<string, number> } }
  | { type: string; data: unknown };

// Kinds of failure node counts as cancelled rather than failed.
const CANCELLED = new Set(['cancelledByParent', 'testTimeoutFailure']);

function verdict(e: Event): string | undefined {
  if (e.type !== 'test:pass' && e.type !== 'test:fail') return undefined;
  const d = e.data as Where & { details?: { error?: { failureType?: string } } };
  const failure = d.details?.error?.failureType;
  const kind =
    d.skip !== undefined && d.skip !== false
      ? 'skipped'
      : d.todo !== undefined && d.todo !== false
        ? 'todo'
        : failure !== undefined && CANCELLED.has(failure)
          ? 'cancelled'
          : undefined;
  if (kind === undefined) return undefined;
  const reason = kind === 'skipped' ? d.skip : kind === 'todo' ? d.todo : failure;
  const why = typeof reason === 'string' ? ` (${reason})` : '';
  return `${kind}: ${d.name}${why} at ${d.file ?? '?'}:${d.line ?? '?'}`;
}

export default async function* strictReporter(source: AsyncIterable<Event>): AsyncGenerator<string> {
  const found: string[] = [];
  let counted = 0;
  for await (const e of source) {
    const v = verdict(e);
    if (v !== undefined) found.push(v);
    if (e.type === 'test:summary') {
      const d = e.data as { file?: string; counts: Record<string, number> };
      // The last summary, without a file, totals the whole run: it catches
      // what a per-test event could miss (a file cancelled as a whole).
      if (d.file === undefined) counted = (d.counts.skipped ?? 0) + (d.counts.todo ?? 0) + (d.counts.cancelled ?? 0);
    }
  }
  if (found.length === 0 && counted === 0) return;
  process.exitCode = 1;
  yield `\nstrict-reporter: the run fails, ${Math.max(found.length, counted)} test(s) skipped, todo or cancelled:\n`;
  for (const v of found) yield `  ${v}\n`;
}
