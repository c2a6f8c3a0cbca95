// Kubernetes RBAC as the API server's authorizer applies it, for the tests
// and the fake API server (kube-authz.ts): each request becomes request
// attributes (apiGroup, resource, subresource, verb), like
// k8s.io/apiserver's RequestInfoFactory; the bindings give a service
// account its rules and where they hold (rulesOfServiceAccount); one rule
// matcher (ruleAllows, plugin/pkg/auth/authorizer/rbac RuleAllows) decides.
// Feed it the calls a fake API server recorded.

export interface RecordedCall {
  method: string;
  // Path with optional query string, as an access log shows it:
  // `/apis/kubevirt.io/v1/virtualmachineinstances?labelSelector=...&watch=true`.
  path: string;
  // Query parameters recorded apart from the path (the agent branch's fake
  // API server logs RequestRecord {method, path, query}); merged with any
  // query string in `path`.
  query?: Record<string, string>;
}

export interface RequestAttributes {
  apiGroup: string;
  version: string;
  resource: string;
  subresource: string;
  verb: string;
  namespace: string;
  name: string;
}

export interface PolicyRule {
  apiGroups?: string[];
  resources?: string[];
  verbs: string[];
  resourceNames?: string[];
  nonResourceURLs?: string[];
}

// One (apiGroup, resource[/subresource], verb) a rule grants.
export interface Grant {
  apiGroup: string;
  resource: string;
  verb: string;
}

export interface RbacReport {
  denied: { call: RecordedCall; attributes: RequestAttributes }[];
  unused: Grant[];
}

const VERB_BY_METHOD: Record<string, string> = { POST: 'create', PUT: 'update', PATCH: 'patch' };

export function requestAttributes(call: RecordedCall): RequestAttributes {
  const url = new URL(call.path, 'http://api.invalid');
  for (const [k, v] of Object.entries(call.query ?? {})) url.searchParams.set(k, v);
  const parts = url.pathname
    .split('/')
    .filter((p) => p !== '')
    .map(decodeURIComponent);
  let apiGroup: string;
  let version: string;
  let rest: string[];
  if (parts[0] === 'api' && parts.length >= 2) {
    apiGroup = '';
    version = parts[1];
    rest = parts.slice(2);
  } else if (parts[0] === 'apis' && parts.length >= 3) {
    apiGroup = parts[1];
    version = parts[2];
    rest = parts.slice(3);
  } else {
    throw new Error(`not a resource request: ${call.method} ${call.path}`);
  }
  const method = call.method.toUpperCase();
  let legacyWatch = false;
  if (rest[0] === 'watch') {
    legacyWatch = true;
    rest = rest.slice(1);
  }
  let namespace = '';
  // `/api/v1/namespaces/x` is the namespace object itself; `/namespaces/x/<res>` scopes.
  if (rest[0] === 'namespaces' && rest.length >= 3) {
    namespace = rest[1];
    rest = rest.slice(2);
  }
  const [resource = '', name = '', subresource = '', ...extra] = rest;
  if (resource === '' || extra.length > 0) throw new Error(`cannot parse resource path: ${call.method} ${call.path}`);
  const watchParam = url.searchParams.get('watch');
  const isWatch = legacyWatch || watchParam === 'true' || watchParam === '1';
  let verb: string;
  if (method === 'GET' || method === 'HEAD') {
    verb = isWatch ? 'watch' : name === '' ? 'list' : 'get';
  } else if (method === 'DELETE') {
    verb = name === '' ? 'deletecollection' : 'delete';
  } else {
    const mapped = VERB_BY_METHOD[method];
    if (mapped === undefined) throw new Error(`unknown HTTP method: ${call.method}`);
    verb = mapped;
  }
  // A list or watch of one name (fieldSelector=metadata.name=<name>) is
  // authorized as a request on that name (k8s.io/apiserver requestinfo.go),
  // so rules with resourceNames can allow it.
  const field = /^metadata\.name==?([^,]+)$/.exec(url.searchParams.get('fieldSelector') ?? '');
  const named = name === '' && (verb === 'list' || verb === 'watch') && field !== null ? field[1] : name;
  return { apiGroup, version, resource, subresource, verb, namespace, name: named };
}

function qualifiedResource(a: { resource: string; subresource: string }): string {
  return a.subresource === '' ? a.resource : `${a.resource}/${a.subresource}`;
}

function matches(list: string[] | undefined, value: string): boolean {
  return (list ?? []).some((v) => v === '*' || v === value);
}

// Kubernetes' RuleAllows: group, verb, resource (with `res/*` and `*/sub`
// forms) and, when set, resourceNames.
export function ruleAllows(rule: PolicyRule, a: RequestAttributes): boolean {
  if (!matches(rule.verbs, a.verb) || !matches(rule.apiGroups, a.apiGroup)) return false;
  const full = qualifiedResource(a);
  const resourceOk = (rule.resources ?? []).some(
    (r) =>
      r === '*' || r === full || (a.subresource === '' ? false : r === `${a.resource}/*` || r === `*/${a.subresource}`),
  );
  if (!resourceOk) return false;
  if (rule.resourceNames !== undefined && rule.resourceNames.length > 0) return rule.resourceNames.includes(a.name);
  return true;
}

export function grantsOf(rules: PolicyRule[]): Grant[] {
  const out: Grant[] = [];
  for (const rule of rules) {
    if (rule.nonResourceURLs !== undefined && rule.nonResourceURLs.length > 0) {
      throw new Error('nonResourceURLs rules are not expected in the agent role');
    }
    for (const apiGroup of rule.apiGroups ?? [])
      for (const resource of rule.resources ?? [])
        for (const verb of rule.verbs) out.push({ apiGroup, resource, verb });
  }
  return out;
}

function grantCovers(g: Grant, a: RequestAttributes): boolean {
  return ruleAllows({ apiGroups: [g.apiGroup], resources: [g.resource], verbs: [g.verb] }, a);
}

// Every call must be allowed and every granted (group, resource, verb) must
// be used by at least one call: least privilege, proven both ways.
export function checkRbac(rules: PolicyRule[], calls: RecordedCall[]): RbacReport {
  const attributes = calls.map((call) => ({ call, attributes: requestAttributes(call) }));
  const denied = attributes.filter((c) => !rules.some((r) => ruleAllows(r, c.attributes)));
  const unused = grantsOf(rules).filter((g) => !attributes.some((c) => grantCovers(g, c.attributes)));
  return { denied, unused };
}

// --- bindings: which rules a ServiceAccount holds, and where -----------------

// Rules held through one binding. `namespace` '' is a ClusterRoleBinding
// (valid for every request, cluster-scoped ones included); otherwise a
// RoleBinding, whose grant holds for requests in that namespace only,
// whether its roleRef is a Role or a ClusterRole (Kubernetes RBAC).
export interface ScopedRules {
  namespace: string;
  rules: PolicyRule[];
  // e.g. `RoleBinding team-a/vmseed-agent -> ClusterRole vmseed-agent`
  via: string;
}

interface RbacObject {
  kind: string;
  metadata: { name: string; namespace?: string };
  rules?: PolicyRule[];
  roleRef?: { apiGroup: string; kind: string; name: string };
  subjects?: { kind: string; name: string; namespace?: string }[];
}

// A binding names the account as a ServiceAccount subject (its namespace
// defaulting to a RoleBinding's own), as its user name, or through the
// groups every service account is in (rbac.go appliesToUser).
function bindsAccount(b: RbacObject, account: { namespace: string; name: string }): boolean {
  const groups = ['system:serviceaccounts', `system:serviceaccounts:${account.namespace}`, 'system:authenticated'];
  const bindingNs = b.kind === 'RoleBinding' ? b.metadata.namespace : undefined;
  return (b.subjects ?? []).some(
    (s) =>
      (s.kind === 'ServiceAccount' && s.name === account.name && (s.namespace || bindingNs) === account.namespace) ||
      (s.kind === 'Group' && groups.includes(s.name)) ||
      (s.kind === 'User' && s.name === `system:serviceaccount:${account.namespace}:${account.name}`),
  );
}

export function rulesOfServiceAccount(
  objects: readonly unknown[],
  account: { namespace: string; name: string },
): ScopedRules[] {
  const all = objects as RbacObject[];
  const out: ScopedRules[] = [];
  for (const b of all.filter((o) => o.kind === 'ClusterRoleBinding' || o.kind === 'RoleBinding')) {
    if (!bindsAccount(b, account)) continue;
    const ref = b.roleRef!;
    if (b.kind === 'ClusterRoleBinding' && ref.kind !== 'ClusterRole')
      throw new Error(`ClusterRoleBinding ${b.metadata.name}: roleRef must be a ClusterRole`);
    const namespace = b.kind === 'RoleBinding' ? (b.metadata.namespace ?? '') : '';
    if (b.kind === 'RoleBinding' && namespace === '')
      throw new Error(`RoleBinding ${b.metadata.name} has no namespace`);
    const role = all.find(
      (o) =>
        o.kind === ref.kind &&
        o.metadata.name === ref.name &&
        (ref.kind === 'ClusterRole' || o.metadata.namespace === namespace),
    );
    if (role === undefined)
      throw new Error(`${b.kind} ${namespace}/${b.metadata.name}: no ${ref.kind} ${ref.name} to bind`);
    out.push({
      namespace,
      rules: role.rules ?? [],
      via: `${b.kind} ${namespace ? namespace + '/' : ''}${b.metadata.name} -> ${ref.kind} ${ref.name}`,
    });
  }
  return out;
}

export function scopedAllows(scoped: readonly ScopedRules[], a: RequestAttributes): boolean {
  return scoped.some(
    (s) => (s.namespace === '' || s.namespace === a.namespace) && s.rules.some((r) => ruleAllows(r, a)),
  );
}

// checkRbac over bindings: every call allowed in its namespace; a grant is
// unused when no call uses it in any scope it is held in.
export function checkScopedRbac(scoped: readonly ScopedRules[], calls: RecordedCall[]): RbacReport {
  const attributes = calls.map((call) => ({ call, attributes: requestAttributes(call) }));
  const denied = attributes.filter((c) => !scopedAllows(scoped, c.attributes));
  const seen = new Set<string>();
  const unused: Grant[] = [];
  for (const s of scoped) {
    for (const g of grantsOf(s.rules)) {
      const key = `${g.apiGroup} ${g.resource} ${g.verb}`;
      const used = scoped
        .filter((t) => grantsOf(t.rules).some((h) => `${h.apiGroup} ${h.resource} ${h.verb}` === key))
        .some((t) =>
          attributes.some(
            (c) => (t.namespace === '' || t.namespace === c.attributes.namespace) && grantCovers(g, c.attributes),
          ),
        );
      if (!used && !seen.has(key)) unused.push(g);
      seen.add(key);
    }
  }
  return { denied, unused };
}
