// The node-level redirect of 169.254.169.254:80 to the NoCloud datasource,
// as an nftables ruleset in a table of vmseed's own. Nothing here touches
// kube-proxy's or the CNI's tables (iptables-nft's `ip nat`/`ip filter`,
// Calico's, Cilium's): they are other tables, and nftables runs every base
// chain hooked at prerouting, in priority order.
//
// Only VMs are redirected: the rule matches sources in the table's set of
// this node's launcher pod addresses (kept current by the keeper from the
// agent's file, launcher-file.ts). Every other pod's 169.254.169.254 is left
// alone, so on a cloud node ordinary pods keep the provider's metadata
// service (instance credentials, the GKE metadata server).
//
// One `nft -f -` transaction creates the table if it is missing, deletes it
// and defines it again, so applying is atomic (no moment without the rule)
// and idempotent (applying twice gives one rule), whatever state the table
// was left in.
import { createHash } from 'node:crypto';
import { isIPv4 } from 'node:net';
import { VmseedError } from '../errors.ts';

/**
 * What the redirect rule is made of (the `vmseed redirect` flags); checkSpec
 * validates it before any of it reaches nft.
 */
export interface RedirectSpec {
  // Our table (family ip). Default `vmseed`.
  table: string;
  // Where guests' requests go: the datasource listener as the node reaches
  // it (the node's own address when the agent runs on the host network).
  to: { host: string; port: number };
  // Interface name patterns pods' traffic arrives on (`*` at the end only,
  // as nftables' iifname wildcards): veth* (bridge/ptp plugins, kindnet,
  // flannel with veth), cali* (Calico), lxc* (Cilium without kube-proxy
  // replacement), cni0/cbr0 (bridge plugins whose pods sit behind a bridge).
  podInterfaces: string[];
  // The metadata address and port guests ask for.
  metadata: { address: string; port: number };
  // Redirect every pod, not only the launcher pods in the set: takes the
  // cloud's metadata service from every pod on the node. For nodes with
  // no such service whose agent writes no launcher file.
  allPods?: boolean;
  // --session-hop-limit: the IP TTL set on the answers of redirected
  // connections that are no plain GET/HEAD/POST (the datasource's
  // `PUT /v1/session`), so a session token does not cross more routed hops
  // than that (EC2's HttpPutResponseHopLimit). Absent: no such rule.
  sessionHopLimit?: number;
}

/**
 * The --pod-interface default: the interface names of the common CNI plugins
 * (see RedirectSpec.podInterfaces).
 */
export const DEFAULT_POD_INTERFACES = ['veth*', 'cali*', 'lxc*', 'cni0', 'cbr0'];
/** The --table default: the nftables table (family ip) of vmseed's own. */
export const DEFAULT_TABLE = 'vmseed';
export const CHAIN = 'prerouting';
/** The table's set of this node's launcher pod addresses: the only sources redirected. */
export const LAUNCHER_SET = 'launchers';
/** The chains of --session-hop-limit: marking connections, and setting their answers' TTL. */
export const SESSION_MARK_CHAIN = 'session-mark';
export const SESSION_TTL_CHAIN = 'session-ttl';
// Bits of the conntrack mark, set with `|` so other users' bits stay:
// DECIDED once a connection's first data segment has been seen, SESSION
// when that segment was no plain GET/HEAD/POST.
export const CT_DECIDED = 0x40000000;
export const CT_SESSION = 0x20000000;
// The first four bytes of the requests that stay plain: every datasource
// request but the session PUT (IMDS and NoCloud GET/HEAD, progress POSTs).
const PLAIN_STARTS = ['GET ', 'HEAD', 'POST'];

const NAME_RE = /^[A-Za-z][A-Za-z0-9_-]{0,30}$/;
const IFACE_RE = /^[A-Za-z0-9_.:-]{1,15}\*?$/;

function invalid(field: string, message: string): VmseedError {
  return new VmseedError('REDIRECT_INVALID', message, { kind: 'terminal', field });
}

/**
 * Checks everything that goes into the ruleset text, so nothing can be injected
 * into nft's input language through a flag; throws a terminal REDIRECT_INVALID
 * naming the flag.
 */
export function checkSpec(spec: RedirectSpec): RedirectSpec {
  if (!NAME_RE.test(spec.table))
    throw invalid(
      'table',
      `table name '${spec.table}' must be letters, digits, _ or - (at most 31), starting with a letter`,
    );
  if (!isIPv4(spec.to.host))
    throw invalid(
      'to',
      `redirect target '${spec.to.host}' must be an IPv4 address (the node's address the datasource listens on)`,
    );
  if (!isIPv4(spec.metadata.address))
    throw invalid('metadata-address', `metadata address '${spec.metadata.address}' must be an IPv4 address`);
  for (const [field, port] of [
    ['to', spec.to.port],
    ['metadata-port', spec.metadata.port],
  ] as const) {
    if (!Number.isInteger(port) || port < 1 || port > 65535) throw invalid(field, `port ${port} must be 1-65535`);
  }
  if (spec.podInterfaces.length === 0 || spec.podInterfaces.length > 32)
    throw invalid('pod-interface', 'give between 1 and 32 --pod-interface patterns');
  for (const p of spec.podInterfaces) {
    if (!IFACE_RE.test(p))
      throw invalid(
        'pod-interface',
        `interface pattern '${p}' must be an interface name (at most 15 characters) with an optional trailing *`,
      );
  }
  const hops = spec.sessionHopLimit;
  if (hops !== undefined && (!Number.isInteger(hops) || hops < 1 || hops > 255))
    throw invalid('session-hop-limit', `session hop limit ${hops} must be an integer from 1 to 255`);
  return spec;
}

// A digest of what the rule should be, carried in the rule's comment, so a
// check can tell our current rule from one left by an older configuration.
export function specDigest(spec: RedirectSpec): string {
  const canonical = JSON.stringify([
    spec.table,
    spec.to.host,
    spec.to.port,
    [...spec.podInterfaces].sort(),
    spec.metadata.address,
    spec.metadata.port,
    spec.allPods === true ? 'all-pods' : LAUNCHER_SET,
    // Absent from the older digests' input: a rule without a hop limit keeps its digest.
    ...(spec.sessionHopLimit !== undefined ? [`session-hop-limit ${spec.sessionHopLimit}`] : []),
  ]);
  return createHash('sha256').update(canonical).digest('hex').slice(0, 16);
}

export function ruleComment(spec: RedirectSpec): string {
  return `vmseed-redirect ${specDigest(spec)}`;
}

// The comments of the hop limit's two rules that are checked for.
export function sessionComments(spec: RedirectSpec): { mark: string; ttl: string } {
  const digest = specDigest(spec);
  return { mark: `vmseed-session-mark ${digest}`, ttl: `vmseed-session-ttl ${digest}` };
}

const hex = (n: number) => `0x${n.toString(16).padStart(8, '0')}`;

// --session-hop-limit. A connection is judged by its first data segment
// from the guest, after the DNAT (so only our redirect's connections, to
// our target): GET/HEAD/POST leave it plain, anything else (a PUT, or a
// first segment too short to tell, which no real client sends) marks it a
// session connection for good, and every answer on it leaves the node with
// IP TTL N. The datasource answers `PUT /v1/session` only as the first
// request of a connection (src/datasource/imds/connection-order.ts), so a
// session answer never rides a connection judged plain, however the guest
// splits or pipelines its bytes. Postrouting sees both answers the node's
// own listener sends (the agent on the host network) and answers it
// forwards from a target elsewhere, after the forward's own decrement.
function sessionChains(spec: RedirectSpec, hops: number): string[] {
  const c = sessionComments(spec);
  const undecided =
    `ip daddr ${spec.to.host} tcp dport ${spec.to.port} ct direction original ct status dnat ` +
    `ct original ip daddr ${spec.metadata.address} ct mark & ${hex(CT_DECIDED)} == 0`;
  const plain = PLAIN_STARTS.map((p) => `0x${Buffer.from(p, 'latin1').toString('hex')}`).join(', ');
  return [
    `  chain ${SESSION_MARK_CHAIN} {`,
    // After every DNAT (ours at dstnat - 10, iptables-nft's at dstnat).
    `    type filter hook prerouting priority dstnat + 10; policy accept;`,
    `    ${undecided} @ih,0,32 { ${plain} } ct mark set ct mark | ${hex(CT_DECIDED)}`,
    // `@ih,0,8 & 0 == 0`: any segment with a byte of payload (a bare ACK has none).
    `    ${undecided} @ih,0,8 & 0x0 == 0x0 ct mark set ct mark | ${hex(CT_DECIDED | CT_SESSION)} counter comment "${c.mark}"`,
    `  }`,
    `  chain ${SESSION_TTL_CHAIN} {`,
    `    type filter hook postrouting priority filter; policy accept;`,
    `    ct direction reply ct mark & ${hex(CT_SESSION)} == ${hex(CT_SESSION)} ip ttl set ${hops} counter comment "${c.ttl}"`,
    `  }`,
  ];
}

/**
 * The `nft -f -` input that replaces our table with the redirect rule in one
 * transaction (atomic, idempotent); checks the spec first.
 */
export function renderRuleset(spec: RedirectSpec, launchers: readonly string[] = []): string {
  checkSpec(spec);
  const ifaces = spec.podInterfaces.map((p) => `"${p}"`).join(', ');
  const sources = spec.allPods === true ? '' : `ip saddr @${LAUNCHER_SET} `;
  return [
    `table ip ${spec.table} {}`,
    `delete table ip ${spec.table}`,
    `table ip ${spec.table} {`,
    ...(spec.allPods === true ? [] : [`  set ${LAUNCHER_SET} {`, `    type ipv4_addr;`, `  }`]),
    `  chain ${CHAIN} {`,
    // Before iptables-nft's nat PREROUTING (dstnat, -100), so kube-proxy's
    // rules never see these packets; they do not match 169.254.169.254 anyway.
    `    type nat hook prerouting priority dstnat - 10; policy accept;`,
    `    iifname { ${ifaces} } ${sources}ip daddr ${spec.metadata.address} tcp dport ${spec.metadata.port} counter dnat to ${spec.to.host}:${spec.to.port} comment "${ruleComment(spec)}"`,
    `  }`,
    ...(spec.sessionHopLimit !== undefined ? sessionChains(spec, spec.sessionHopLimit) : []),
    `}`,
    ...(spec.allPods === true ? [] : addElements(spec, launchers)),
    '',
  ].join('\n');
}

// Only IPv4 text reaches nft's input (the set's type, and no injection).
function addElements(spec: RedirectSpec, launchers: readonly string[]): string[] {
  const valid = launchers.filter((a) => isIPv4(a));
  return valid.length === 0 ? [] : [`add element ip ${spec.table} ${LAUNCHER_SET} { ${valid.join(', ')} }`];
}

/**
 * The `nft -f -` input that makes the launcher set exactly `launchers` in
 * one transaction (no moment with a launcher missing); addresses that are
 * not IPv4 are left out.
 */
export function renderLauncherSync(spec: RedirectSpec, launchers: readonly string[]): string {
  checkSpec(spec);
  return [`flush set ip ${spec.table} ${LAUNCHER_SET}`, ...addElements(spec, launchers), ''].join('\n');
}

/**
 * The launcher set's elements in `nft -j list table` output, sorted; undefined
 * when the set is not there.
 */
export function launcherSetElements(listJson: string, spec: RedirectSpec): string[] | undefined {
  let doc: { nftables?: Array<Record<string, Record<string, unknown>>> };
  try {
    doc = JSON.parse(listJson) as typeof doc;
  } catch {
    return undefined;
  }
  const set = (doc.nftables ?? []).find((i) => i.set && i.set.table === spec.table && i.set.name === LAUNCHER_SET)?.set;
  if (set === undefined) return undefined;
  const elem = Array.isArray(set.elem) ? (set.elem as unknown[]) : [];
  return elem.filter((e): e is string => typeof e === 'string').sort();
}

export function renderRemoval(spec: RedirectSpec): string {
  checkSpec(spec);
  // Creating it first makes removal succeed when it is already gone.
  return `table ip ${spec.table} {}\ndelete table ip ${spec.table}\n`;
}

// Is our rule in place? Reads `nft -j list table ip <table>` output: the
// table's prerouting chain hooked for nat, and a rule with our comment that
// DNATs to the target. Anything else (no table, flushed chain, a rule from
// another configuration) is "not in place".
export function ruleInPlace(listJson: string, spec: RedirectSpec): boolean {
  let doc: { nftables?: Array<Record<string, Record<string, unknown>>> };
  try {
    doc = JSON.parse(listJson) as typeof doc;
  } catch {
    return false;
  }
  const items = doc.nftables ?? [];
  const chain = items.find((i) => i.chain && i.chain.table === spec.table && i.chain.name === CHAIN)?.chain;
  if (!chain || chain.type !== 'nat' || chain.hook !== 'prerouting') return false;
  if (spec.allPods !== true && launcherSetElements(listJson, spec) === undefined) return false;
  if (spec.sessionHopLimit !== undefined && !sessionRulesInPlace(items, spec)) return false;
  const want = ruleComment(spec);
  return items.some((i) => {
    const r = i.rule;
    if (!r || r.table !== spec.table || r.chain !== CHAIN || r.comment !== want) return false;
    const dnat = (r.expr as Array<Record<string, { addr?: unknown; port?: unknown }>> | undefined)?.find(
      (e) => e.dnat,
    )?.dnat;
    return dnat?.addr === spec.to.host && dnat?.port === spec.to.port;
  });
}

// The hop limit's chains hooked where they belong and their rules there, by comment.
function sessionRulesInPlace(items: Array<Record<string, Record<string, unknown>>>, spec: RedirectSpec): boolean {
  const c = sessionComments(spec);
  const hooked = (name: string, hook: string) =>
    items.some(
      (i) =>
        i.chain?.table === spec.table && i.chain.name === name && i.chain.type === 'filter' && i.chain.hook === hook,
    );
  const rule = (chain: string, comment: string) =>
    items.some((i) => i.rule?.table === spec.table && i.rule.chain === chain && i.rule.comment === comment);
  return (
    hooked(SESSION_MARK_CHAIN, 'prerouting') &&
    hooked(SESSION_TTL_CHAIN, 'postrouting') &&
    rule(SESSION_MARK_CHAIN, c.mark) &&
    rule(SESSION_TTL_CHAIN, c.ttl)
  );
}
