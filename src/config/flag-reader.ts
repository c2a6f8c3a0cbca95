// The agent's flags as given on the command line or in the environment,
// each turned into its value (or its default's) the first time it is read.
import { parseArgs } from 'node:util';
import {
  AGENT_FLAGS,
  MOVED_FLAGS,
  envName,
  type DefaultContext,
  type FlagName,
  type FlagSpec,
  type FlagValue,
} from './flags.ts';
import { ConfigError } from './values.ts';

const PARSE_OPTIONS = {
  ...Object.fromEntries(
    Object.entries(AGENT_FLAGS).map(([name, spec]: [string, FlagSpec<unknown>]) => [
      name,
      { type: spec.arg === undefined ? ('boolean' as const) : ('string' as const) },
    ]),
  ),
  help: { type: 'boolean', short: 'h' },
} as const;

// Undefined when --help was asked for.
export function readFlags(argv: string[], env: NodeJS.ProcessEnv, cwd: string): FlagReader | undefined {
  refuseMoved(argv, env);
  let parsed;
  try {
    parsed = parseArgs({ args: argv, options: PARSE_OPTIONS, strict: true, allowPositionals: false });
  } catch (e) {
    throw new ConfigError((e as Error).message.split('\n')[0]);
  }
  if (parsed.values.help) return undefined;
  return new FlagReader(parsed.values, env, cwd);
}

// The admission webhook runs off the VM nodes: a node agent must not hold
// its certificate or take its traffic, so its old flags are an error, not
// a no-op an operator would not notice.
function refuseMoved(argv: string[], env: NodeJS.ProcessEnv): void {
  for (const [name, command] of Object.entries(MOVED_FLAGS)) {
    const variable = `VMSEED_${name.toUpperCase().replaceAll('-', '_')}`;
    const onCommandLine = argv.some((a) => a === `--${name}` || a.startsWith(`--${name}=`));
    if (onCommandLine || (env[variable] ?? '') !== '') {
      throw new ConfigError(
        `${onCommandLine ? `--${name}` : variable} is not a flag of the node agent any more: the admission webhook runs as \`${command}\` (a Deployment off the VM nodes, deploy/webhook); remove it from the agent's arguments and environment`,
      );
    }
  }
}

export class FlagReader implements DefaultContext {
  readonly local: boolean;
  readonly #argv: Record<string, string | boolean | undefined>;
  readonly #env: NodeJS.ProcessEnv;
  readonly #cwd: string;
  readonly #values = new Map<string, unknown>();

  constructor(argv: Record<string, string | boolean | undefined>, env: NodeJS.ProcessEnv, cwd: string) {
    this.#argv = argv;
    this.#env = env;
    this.#cwd = cwd;
    this.local = this.given('local') !== undefined;
  }

  // The flag's own text (a switch given is `true`), else its environment
  // variable's; an empty variable counts as unset.
  given(name: FlagName): string | undefined {
    const v = this.#argv[name];
    if (typeof v === 'string') return v;
    if (v === true) return 'true';
    const e = this.#env[envName(name)];
    return e === undefined || e === '' ? undefined : e;
  }

  defaultText(name: FlagName): string | undefined {
    const spec: FlagSpec<unknown> = AGENT_FLAGS[name];
    const d = spec.byMode
      ? spec.byMode[this.local ? 'local' : 'cluster']
      : spec.byPlatform
        ? spec.byPlatform[this.get('platform')]
        : spec.default;
    if (d === undefined || typeof d === 'string') return d;
    return typeof d.text === 'function' ? d.text(this) : d.text;
  }

  text(name: string): string | undefined {
    return this.given(name as FlagName) ?? this.defaultText(name as FlagName);
  }

  get<K extends FlagName>(name: K): FlagValue<K> {
    if (!this.#values.has(name)) {
      const spec: FlagSpec<unknown> = AGENT_FLAGS[name];
      const text = this.text(name);
      if (text === undefined && !spec.optional) throw new ConfigError(spec.required ?? `--${name} is required`);
      this.#values.set(name, text === undefined ? undefined : spec.parse(text, name, this.#cwd));
    }
    return this.#values.get(name) as FlagValue<K>;
  }

  value(name: string): unknown {
    return this.get(name as FlagName);
  }
}
