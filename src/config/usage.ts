// `vmseed agent --help`, rendered from the flag table.
import { AGENT_FLAGS, docOf, type FlagSpec } from './flags.ts';

const WIDTH = 115;
// Where the descriptions start.
const COLUMN = 30;

function defaults(spec: FlagSpec<unknown>): string | undefined {
  if (spec.byMode) return `cluster: ${docOf(spec.byMode.cluster)}, local: ${docOf(spec.byMode.local)}`;
  if (spec.byPlatform)
    return `kubevirt: ${docOf(spec.byPlatform.kubevirt)}; libvirt: ${docOf(spec.byPlatform.libvirt)}`;
  // A switch is off unless given.
  const d = spec.default;
  if (d === undefined || spec.arg === undefined) return undefined;
  if (typeof d === 'string') return `default ${d}`;
  return typeof d.text === 'string' ? `default ${d.text}, ${d.doc}` : `default ${d.doc}`;
}

function describe(spec: FlagSpec<unknown>): string {
  const notes = [spec.env && `env ${spec.env}`, defaults(spec), spec.note].filter((n) => n);
  return notes.length > 0 ? `${spec.help} (${notes.join('; ')})` : spec.help;
}

function entry(name: string, spec: FlagSpec<unknown>): string[] {
  const head = `  --${name}${spec.arg === undefined ? '' : ` ${spec.arg}`}`;
  const lines: string[] = [];
  let line = head.length < COLUMN ? head.padEnd(COLUMN) : `${head}  `;
  let first = true;
  for (const word of describe(spec).split(' ')) {
    if (!first && line.length + 1 + word.length > WIDTH) {
      lines.push(line);
      line = ' '.repeat(COLUMN) + word;
    } else line += first ? word : ` ${word}`;
    first = false;
  }
  lines.push(line);
  return lines;
}

/** The option lines of a flag table, as `--help` shows them. */
export function flagLines(flags: Record<string, FlagSpec<unknown>>): string {
  return Object.entries(flags)
    .flatMap(([name, spec]) => entry(name, spec))
    .join('\n');
}

export const AGENT_USAGE = `usage: vmseed agent [options]

${flagLines(AGENT_FLAGS)}

Every flag can also be set as VMSEED_<FLAG> in the environment (e.g. VMSEED_STATE_DIR).
`;
