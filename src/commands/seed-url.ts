// `vmseed seed-url` prints the DMI serial string that points a VMI's
// cloud-init at its seed on the node's NoCloud HTTP datasource, for
// `spec.domain.firmware.serial`: bound to one VMI's UID, or to a
// VirtualMachine (every VMI it starts), the binding the webhook writes.
import { readFile } from 'node:fs/promises';
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { parseYaml, where } from '../cloudinit/yaml.ts';
import { isVmseedError } from '../errors.ts';
import { DatasourceKeyring, fileKeySource } from '../datasource/tokens.ts';
import { DEFAULT_DATASOURCE_BASE, datasourceSeedUrl, datasourceSerial } from '../datasource/url.ts';
import { bindingMessage, NONCE_ANNOTATION, type BindingMeta } from '../datasource/binding.ts';
import { UsageError, type Command } from './cli.ts';

/**
 * `vmseed seed-url`'s flags, for parseArgs and for the help text (and the
 * README's table).
 */
export const OPTIONS = {
  uid: { type: 'string' },
  vmi: { type: 'string' },
  vm: { type: 'string' },
  'vm-uid': { type: 'string' },
  'binding-from': { type: 'string' },
  'key-file': { type: 'string' },
  base: { type: 'string', default: DEFAULT_DATASOURCE_BASE },
  ds: { type: 'string', default: 'nocloud' },
  'url-only': { type: 'boolean', default: false },
  help: { type: 'boolean', short: 'h', default: false },
} as const;

/** One help line per flag of OPTIONS (a test keeps the two in step). */
export const OPTION_HELP: ReadonlyArray<[string, string]> = [
  ['--uid UID', "bind the token to this VMI's metadata.uid (this VMI only)"],
  ['--vmi FILE', 'read namespace, name and uid from a VMI manifest (YAML/JSON)'],
  ['--vm NS/NAME', 'the VirtualMachine whose every VMI the token opens (with --vm-uid)'],
  ['--vm-uid UID', "the VirtualMachine's metadata.uid (a VM re-created gets a new one)"],
  [
    '--binding-from FILE',
    'a VirtualMachine manifest, or a VMI manifest bound as the webhook binds it (VM owner or nonce)',
  ],
  ['--key-file FILE', 'the datasource key file (first line = signing key)'],
  ['--base URL', `datasource base URL (default ${DEFAULT_DATASOURCE_BASE})`],
  ['--ds ID', 'nocloud (default; cloud-init >= 23.2) or nocloud-net (older guests)'],
  ['--url-only', 'print only the seed URL'],
  ['-h, --help', 'this text'],
];

type Values = {
  uid?: string;
  vmi?: string;
  vm?: string;
  'vm-uid'?: string;
  'binding-from'?: string;
};

const HELP = `usage: vmseed seed-url <namespace>/<name> (--uid UID | --vmi FILE) --key-file FILE [options]
       vmseed seed-url --vm <namespace>/<name> --vm-uid UID --key-file FILE [options]
       vmseed seed-url --binding-from FILE --key-file FILE [options]

Prints the DMI serial string for spec.domain.firmware.serial that points the
VMI's cloud-init at its seed on the node's NoCloud HTTP datasource.

options:
${OPTION_HELP.map(([flag, what]) => `  ${flag.padEnd(22)} ${what}`).join('\n')}
`;

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const NAME = /^([a-z0-9]([-a-z0-9]*[a-z0-9])?)\/([a-z0-9]([-a-z0-9.]*[a-z0-9])?)$/;

interface Manifest {
  kind?: string;
  namespace?: string;
  name?: string;
  uid?: string;
  meta: BindingMeta;
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
  const doc = parsed.value as { kind?: unknown; metadata?: Record<string, unknown> } | null;
  const md = doc?.metadata;
  if (typeof md !== 'object' || md === null)
    throw new UsageError(`${path} has no metadata; is it a VirtualMachineInstance manifest?`);
  const str = (v: unknown) => (typeof v === 'string' && v !== '' ? v : undefined);
  const annotations =
    typeof md.annotations === 'object' && md.annotations !== null ? (md.annotations as Record<string, string>) : {};
  const ownerReferences = Array.isArray(md.ownerReferences)
    ? (md.ownerReferences as NonNullable<BindingMeta['ownerReferences']>)
    : [];
  return {
    kind: str(doc?.kind),
    namespace: str(md.namespace),
    name: str(md.name),
    uid: str(md.uid),
    meta: { annotations, ownerReferences },
  };
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
const VM_UID_HINT = "the VirtualMachine's metadata.uid (kubectl get vm <name> -o jsonpath='{.metadata.uid}')";

// The message the token signs: a VMI's UID, or a binding
// (src/datasource/binding.ts) of a VM or of a VMI's admission nonce.
async function tokenSubject(values: Values, positional: string | undefined, cwd: string): Promise<string> {
  const given = (['uid', 'vmi', 'vm-uid', 'binding-from'] as const).filter((k) => values[k] !== undefined);
  if (given.length > 1)
    throw new UsageError(
      `give one of --uid, --vmi, --vm-uid, --binding-from, not ${given.map((g) => `--${g}`).join(' and ')}`,
    );
  const named = positional === undefined ? undefined : parseName(positional);
  const same = (what: string, ns: string | undefined, name: string | undefined) => {
    if (named !== undefined && ((ns ?? 'default') !== named.namespace || name !== named.name))
      throw new UsageError(`${what} is ${ns ?? 'default'}/${name}, not ${named.namespace}/${named.name}`);
  };
  if (values['vm-uid'] !== undefined || values.vm !== undefined) {
    if (values['vm-uid'] === undefined)
      throw new UsageError("--vm needs --vm-uid UID, the VirtualMachine's metadata.uid");
    const vm = values.vm !== undefined ? parseName(values.vm) : named;
    if (vm === undefined) throw new UsageError('--vm-uid needs --vm <namespace>/<name>, the VirtualMachine');
    same(`--vm ${vm.namespace}/${vm.name}`, vm.namespace, vm.name);
    return vmBinding(vm.namespace, vm.name, checkUuid(values['vm-uid'], '--vm-uid', VM_UID_HINT));
  }
  if (values['binding-from'] !== undefined) {
    const file = values['binding-from'];
    const m = await readManifest(resolve(cwd, file), '--binding-from');
    same(file, m.namespace, m.name);
    const namespace = m.namespace ?? 'default';
    if (m.kind === 'VirtualMachine') {
      if (m.name === undefined || m.uid === undefined)
        throw new UsageError(
          `${file} has no metadata.name or metadata.uid; export it from the cluster (kubectl get vm -o yaml)`,
        );
      return vmBinding(namespace, m.name, checkUuid(m.uid, `${file}: metadata.uid`, VM_UID_HINT));
    }
    const binding = bindingMessage(namespace, m.name, m.meta);
    if (binding === undefined)
      throw new UsageError(
        `${file} is bound to neither a VirtualMachine (no controller ownerReference) nor an admission nonce (${NONCE_ANNOTATION}); give a VirtualMachine manifest, or --uid for this VMI alone`,
      );
    return binding;
  }
  let uid = values.uid;
  if (values.vmi !== undefined) {
    const vmi = await readManifest(resolve(cwd, values.vmi), '--vmi');
    if (vmi.uid === undefined) {
      throw new UsageError(
        `${values.vmi} has no metadata.uid; export it from the cluster (kubectl get vmi -o yaml) or pass --uid`,
      );
    }
    same(values.vmi, vmi.namespace, vmi.name);
    uid = vmi.uid;
  } else if (named === undefined) {
    throw new UsageError('give <namespace>/<name> (or --vmi FILE)');
  }
  if (uid === undefined || uid.trim() === '')
    throw new UsageError('--uid UID (or --vmi FILE) is required: the token is bound to the VMI uid');
  return checkUuid(uid, '--uid', VMI_UID_HINT);
}

// The VM-bound message, exactly as the agent computes it from a VMI the VM owns.
function vmBinding(namespace: string, name: string, vmUid: string): string {
  return bindingMessage(namespace, name, {
    ownerReferences: [{ apiVersion: 'kubevirt.io/v1', kind: 'VirtualMachine', uid: vmUid, controller: true }],
  })!;
}

/**
 * `vmseed seed-url`: prints the DMI serial (or, with --url-only, the URL) of a
 * VMI's or VM's signed seed URL. Exit 2 on bad input, 1 when the key file
 * cannot be read.
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
    const subject = await tokenSubject(values, positionals[0], ctx.cwd);
    if (values['key-file'] === undefined) throw new UsageError('--key-file FILE is required');
    if (values.ds !== 'nocloud' && values.ds !== 'nocloud-net')
      throw new UsageError(`--ds must be nocloud or nocloud-net, got '${values.ds}'`);

    const keyring = await DatasourceKeyring.load(fileKeySource(resolve(ctx.cwd, values['key-file'])));
    const url = datasourceSeedUrl(values.base, keyring.sign(subject));
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
