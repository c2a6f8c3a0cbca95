// `vmseed seed-url <namespace>/<name> --uid UID --key-file F [--base URL]`
// prints the DMI serial string that points a VMI's cloud-init at its seed on
// the node's NoCloud HTTP datasource, for `spec.domain.firmware.serial`.
import { readFile } from 'node:fs/promises';
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { parseYaml, where } from '../cloudinit/yaml.ts';
import { isVmseedError } from '../errors.ts';
import { DatasourceKeyring, fileKeySource } from '../http/datasource-tokens.ts';
import { DEFAULT_DATASOURCE_BASE, datasourceSeedUrl, datasourceSerial } from '../http/datasource-url.ts';
import { UsageError, type Command } from './cli.ts';

const HELP = `usage: vmseed seed-url <namespace>/<name> (--uid UID | --vmi FILE) --key-file FILE [options]

Prints the DMI serial string for spec.domain.firmware.serial that points the
VMI's cloud-init at its seed on the node's NoCloud HTTP datasource.

options:
  --uid UID          the VMI's metadata.uid (the token is bound to it)
  --vmi FILE         read namespace, name and uid from a VMI manifest (YAML/JSON)
  --key-file FILE    the datasource key file (first line = signing key)
  --base URL         datasource base URL (default ${DEFAULT_DATASOURCE_BASE})
  --ds ID            nocloud (default; cloud-init >= 23.2) or nocloud-net (older guests)
  --url-only         print only the seed URL
`;

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

interface VmiIdentity {
  namespace?: string;
  name?: string;
  uid?: string;
}

async function readVmi(path: string): Promise<VmiIdentity> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (e) {
    throw new UsageError(`cannot read VMI manifest ${path}: ${(e as NodeJS.ErrnoException).code ?? 'error'}`);
  }
  // The agent's budgeted loader (aliases, depth, expanded size).
  let parsed;
  try {
    parsed = parseYaml(text, { field: '--vmi' });
  } catch (e) {
    throw new UsageError(`cannot read VMI manifest ${path}: ${(e as Error).message}`);
  }
  if (!parsed.ok)
    throw new UsageError(`cannot read VMI manifest ${path}: not YAML or JSON (${where(parsed)}: ${parsed.reason})`);
  const doc = parsed.value;
  const md = (doc as { metadata?: Record<string, unknown> } | null)?.metadata;
  if (typeof md !== 'object' || md === null)
    throw new UsageError(`${path} has no metadata; is it a VirtualMachineInstance manifest?`);
  const str = (v: unknown) => (typeof v === 'string' && v !== '' ? v : undefined);
  return { namespace: str(md.namespace), name: str(md.name), uid: str(md.uid) };
}

export const seedUrl: Command = async (ctx) => {
  try {
    const { values, positionals } = parseArgs({
      args: ctx.argv,
      allowPositionals: true,
      options: {
        uid: { type: 'string' },
        vmi: { type: 'string' },
        'key-file': { type: 'string' },
        base: { type: 'string', default: DEFAULT_DATASOURCE_BASE },
        ds: { type: 'string', default: 'nocloud' },
        'url-only': { type: 'boolean', default: false },
        help: { type: 'boolean', short: 'h', default: false },
      },
    });
    if (values.help) {
      ctx.stdout.write(HELP);
      return 0;
    }
    if (positionals.length > 1) throw new UsageError('give one <namespace>/<name>');
    let namespace: string | undefined;
    let name: string | undefined;
    if (positionals[0] !== undefined) {
      const m = /^([a-z0-9]([-a-z0-9]*[a-z0-9])?)\/([a-z0-9]([-a-z0-9.]*[a-z0-9])?)$/.exec(positionals[0]);
      if (!m) throw new UsageError(`'${positionals[0]}' is not <namespace>/<name>`);
      namespace = m[1];
      name = m[3];
    }
    let uid = values.uid;
    if (values.vmi !== undefined) {
      if (uid !== undefined) throw new UsageError('give --uid or --vmi, not both');
      const vmi = await readVmi(resolve(ctx.cwd, values.vmi));
      if (vmi.uid === undefined) {
        throw new UsageError(
          `${values.vmi} has no metadata.uid; export it from the cluster (kubectl get vmi -o yaml) or pass --uid`,
        );
      }
      if (namespace !== undefined && ((vmi.namespace ?? 'default') !== namespace || vmi.name !== name)) {
        throw new UsageError(`${values.vmi} is ${vmi.namespace ?? 'default'}/${vmi.name}, not ${namespace}/${name}`);
      }
      uid = vmi.uid;
    } else if (namespace === undefined) {
      throw new UsageError('give <namespace>/<name> (or --vmi FILE)');
    }
    if (uid === undefined || uid.trim() === '')
      throw new UsageError('--uid UID (or --vmi FILE) is required: the token is bound to the VMI uid');
    // Kubernetes sets metadata.uid to an RFC 4122 UUID; anything else cannot
    // be the VMI's, and a token bound to it would never be served.
    if (!UUID.test(uid))
      throw new UsageError(
        `--uid '${uid}' is not a UUID; give the VMI's metadata.uid (kubectl get vmi <name> -o jsonpath='{.metadata.uid}')`,
      );
    if (values['key-file'] === undefined) throw new UsageError('--key-file FILE is required');
    if (values.ds !== 'nocloud' && values.ds !== 'nocloud-net')
      throw new UsageError(`--ds must be nocloud or nocloud-net, got '${values.ds}'`);

    const keyring = await DatasourceKeyring.load(fileKeySource(resolve(ctx.cwd, values['key-file'])));
    const url = datasourceSeedUrl(values.base, keyring.sign(uid));
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
      return e.code === 'DATASOURCE_KEY_FILE_UNREADABLE' ? 1 : 2;
    }
    ctx.stderr.write('vmseed seed-url: internal error\n');
    return 1;
  }
};

export default seedUrl;
