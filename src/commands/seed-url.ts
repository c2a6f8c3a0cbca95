// `vmseed seed-url` prints the DMI serial string that points a VMI's
// cloud-init at its seed on the node's NoCloud HTTP datasource, for
// `spec.domain.firmware.serial`: with a fresh random token (--new-token),
// which opens the VMI whose own serial carries it, as the webhook's does; or
// with the token of one VMI's UID under a node's key (--uid, --key-file), for
// plain libvirt, where no webhook writes serials.
import { readFile } from 'node:fs/promises';
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { parseYaml, where } from '../cloudinit/yaml.ts';
import { isVmseedError } from '../errors.ts';
import { DatasourceKeyring, fileKeySource, randomToken } from '../datasource/tokens.ts';
import { DEFAULT_DATASOURCE_BASE, datasourceSeedUrl, datasourceSerial } from '../datasource/url.ts';
import { UsageError, type Command } from './cli.ts';

/**
 * `vmseed seed-url`'s flags, for parseArgs and for the help text (and the
 * README's table).
 */
export const OPTIONS = {
  'new-token': { type: 'boolean', default: false },
  uid: { type: 'string' },
  vmi: { type: 'string' },
  'key-file': { type: 'string' },
  base: { type: 'string', default: DEFAULT_DATASOURCE_BASE },
  ds: { type: 'string', default: 'nocloud' },
  'url-only': { type: 'boolean', default: false },
  help: { type: 'boolean', short: 'h', default: false },
} as const;

/** One help line per flag of OPTIONS (a test keeps the two in step). */
export const OPTION_HELP: ReadonlyArray<[string, string]> = [
  ['--new-token', 'a fresh random token, no key: it opens the VMI whose own serial carries it'],
  ['--uid UID', "the token of this VMI's metadata.uid under a node's key (plain libvirt)"],
  ['--vmi FILE', 'read namespace, name and uid from a VMI manifest (YAML/JSON)'],
  ['--key-file FILE', "with --uid/--vmi: that node's datasource key file (first line = signing key)"],
  ['--base URL', `datasource base URL (default ${DEFAULT_DATASOURCE_BASE})`],
  ['--ds ID', 'nocloud (default; cloud-init >= 23.2) or nocloud-net (older guests)'],
  ['--url-only', 'print only the seed URL'],
  ['-h, --help', 'this text'],
];

type Values = {
  uid?: string;
  vmi?: string;
};

const HELP = `usage: vmseed seed-url --new-token [options]
       vmseed seed-url <namespace>/<name> (--uid UID | --vmi FILE) --key-file FILE [options]

Prints the DMI serial string for spec.domain.firmware.serial that points the
VMI's cloud-init at its seed on the node's NoCloud HTTP datasource.
--new-token: a random token, for a VMI (or a VirtualMachine's template) whose
serial its owner sets without the admission webhook; the node serves the
seed of the VMI whose serial carries it, to that VMI's launcher pod only.
Mint a new one for every VM. --uid: the token of one VMI's UID under the key
of the node that runs it (plain libvirt, --platform libvirt).

options:
${OPTION_HELP.map(([flag, what]) => `  ${flag.padEnd(22)} ${what}`).join('\n')}
`;

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const NAME = /^([a-z0-9]([-a-z0-9]*[a-z0-9])?)\/([a-z0-9]([-a-z0-9.]*[a-z0-9])?)$/;

interface Manifest {
  namespace?: string;
  name?: string;
  uid?: string;
}

async function readManifest(path: string, flag: string): Promise<Manifest> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (e) {
    throw new UsageError(`cannot read manifest ${path}: ${(e as NodeJS.ErrnoException).code ?? 'error'}`);
  }
  // The agent's budgeted loader (aliases, depth, expanded size).
  let parsed;
  try {
    parsed = parseYaml(text, { field: flag });
  } catch (e) {
    throw new UsageError(`cannot read manifest ${path}: ${(e as Error).message}`);
  }
  if (!parsed.ok)
    throw new UsageError(`cannot read manifest ${path}: not YAML or JSON (${where(parsed)}: ${parsed.reason})`);
  const doc = parsed.value as { metadata?: Record<string, unknown> } | null;
  const md = doc?.metadata;
  if (typeof md !== 'object' || md === null)
    throw new UsageError(`${path} has no metadata; is it a VirtualMachineInstance manifest?`);
  const str = (v: unknown) => (typeof v === 'string' && v !== '' ? v : undefined);
  return { namespace: str(md.namespace), name: str(md.name), uid: str(md.uid) };
}

function checkUuid(value: string, flag: string, what: string): string {
  // Kubernetes sets metadata.uid to an RFC 4122 UUID; anything else cannot
  // be the object's, and a token bound to it would never be served.
  if (!UUID.test(value)) throw new UsageError(`${flag} '${value}' is not a UUID; give ${what}`);
  return value;
}

function parseName(value: string): { namespace: string; name: string } {
  const m = NAME.exec(value);
  if (!m) throw new UsageError(`'${value}' is not <namespace>/<name>`);
  return { namespace: m[1], name: m[3] };
}

const VMI_UID_HINT = "the VMI's metadata.uid (kubectl get vmi <name> -o jsonpath='{.metadata.uid}')";

// The UID the token signs.
async function tokenUid(values: Values, positional: string | undefined, cwd: string): Promise<string> {
  if (values.uid !== undefined && values.vmi !== undefined) throw new UsageError('give one of --uid, --vmi, not both');
  const named = positional === undefined ? undefined : parseName(positional);
  let uid = values.uid;
  if (values.vmi !== undefined) {
    const vmi = await readManifest(resolve(cwd, values.vmi), '--vmi');
    if (vmi.uid === undefined) {
      throw new UsageError(
        `${values.vmi} has no metadata.uid; export it from the cluster (kubectl get vmi -o yaml) or pass --uid`,
      );
    }
    if (named !== undefined && ((vmi.namespace ?? 'default') !== named.namespace || vmi.name !== named.name))
      throw new UsageError(
        `${values.vmi} is ${vmi.namespace ?? 'default'}/${vmi.name}, not ${named.namespace}/${named.name}`,
      );
    uid = vmi.uid;
  } else if (named === undefined) {
    throw new UsageError('give <namespace>/<name> (or --vmi FILE), or --new-token');
  }
  if (uid === undefined || uid.trim() === '')
    throw new UsageError('--uid UID (or --vmi FILE) is required: the token is bound to the VMI uid');
  return checkUuid(uid, '--uid', VMI_UID_HINT);
}

/**
 * `vmseed seed-url`: prints the DMI serial (or, with --url-only, the URL)
 * with a fresh random token, or with a VMI UID's token. Exit 2 on bad
 * input or usage (a --vmi or --key-file that cannot be read included), 1 on
 * an unexpected failure.
 */
export const seedUrl: Command = async (ctx) => {
  try {
    const { values, positionals } = parseArgs({
      args: ctx.argv,
      allowPositionals: true,
      options: OPTIONS,
    });
    if (values.help) {
      ctx.stdout.write(HELP);
      return 0;
    }
    if (positionals.length > 1) throw new UsageError('give one <namespace>/<name>');
    if (values.ds !== 'nocloud' && values.ds !== 'nocloud-net')
      throw new UsageError(`--ds must be nocloud or nocloud-net, got '${values.ds}'`);
    let url: string;
    if (values['new-token']) {
      const other = (['uid', 'vmi', 'key-file'] as const).filter((k) => values[k] !== undefined);
      if (other.length > 0)
        throw new UsageError(`--new-token takes no key and no VMI: drop ${other.map((k) => `--${k}`).join(' and ')}`);
      if (positionals.length > 0)
        throw new UsageError(
          '--new-token takes no <namespace>/<name>: the token is random, and opens the VMI whose serial carries it',
        );
      url = datasourceSeedUrl(values.base, randomToken());
    } else {
      const uid = await tokenUid(values, positionals[0], ctx.cwd);
      if (values['key-file'] === undefined)
        throw new UsageError('--key-file FILE is required: the key of the node that runs the VMI');
      const keyring = await DatasourceKeyring.load(fileKeySource(resolve(ctx.cwd, values['key-file'])));
      url = datasourceSeedUrl(values.base, keyring.sign(uid));
    }
    ctx.stdout.write((values['url-only'] ? url : datasourceSerial(url, values.ds)) + '\n');
    return 0;
  } catch (e) {
    if (
      e instanceof UsageError ||
      (e instanceof TypeError && (e as NodeJS.ErrnoException).code?.startsWith('ERR_PARSE_ARGS'))
    ) {
      ctx.stderr.write(`vmseed seed-url: ${e.message}\n`);
      return 2;
    }
    if (isVmseedError(e)) {
      ctx.stderr.write(`vmseed seed-url: ${e.code}: ${e.message}\n`);
      // An unreadable or malformed --key-file is bad input, like --vmi's.
      return 2;
    }
    ctx.stderr.write('vmseed seed-url: internal error\n');
    return 1;
  }
};

export default seedUrl;
