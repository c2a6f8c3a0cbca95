// The API server's RBAC authorizer, for the fake API server: the rules the
// manifests grant one service account (ClusterRole via ClusterRoleBinding
// everywhere; Role or ClusterRole via RoleBinding in the binding's namespace
// only), and the Forbidden Status Kubernetes answers when no rule allows a
// request. Rule matching is k8s.io/kubernetes plugin/pkg/auth/authorizer/rbac
// (RuleAllows), shared with test/deploy/rbac.test.ts through rbac.ts.
import { readFileSync } from 'node:fs';
import { loadAll } from 'js-yaml';
import { ruleAllows, type PolicyRule, type RequestAttributes } from './rbac.ts';

export interface ServiceAccountRef {
  namespace: string;
  name: string;
}

export interface RbacPolicy {
  // Rules that apply in every namespace and at the cluster scope.
  cluster: PolicyRule[];
  // Rules that apply only to requests in that namespace.
  namespaced: Map<string, PolicyRule[]>;
}

interface Obj {
  kind?: string;
  metadata?: { name?: string; namespace?: string };
  rules?: PolicyRule[];
  roleRef?: { kind?: string; name?: string };
  subjects?: Array<{ kind?: string; name?: string; namespace?: string }>;
}

export const AGENT_SERVICE_ACCOUNT: ServiceAccountRef = { namespace: 'vmseed', name: 'vmseed' };

export function serviceAccountUser(sa: ServiceAccountRef): string {
  return `system:serviceaccount:${sa.namespace}:${sa.name}`;
}

export function loadManifestObjects(path: string): unknown[] {
  return (loadAll(readFileSync(path, 'utf8')) as unknown[]).filter((d) => d !== null && d !== undefined);
}

// What the manifests grant `sa` (ServiceAccount subjects, and the groups
// every service account is in).
export function rbacFromManifests(objects: unknown[], sa: ServiceAccountRef = AGENT_SERVICE_ACCOUNT): RbacPolicy {
  const objs = objects as Obj[];
  const clusterRoles = new Map(objs.filter((o) => o.kind === 'ClusterRole').map((o) => [o.metadata?.name ?? '', o.rules ?? []]));
  const roles = new Map(objs.filter((o) => o.kind === 'Role').map((o) => [`${o.metadata?.namespace ?? 'default'}/${o.metadata?.name ?? ''}`, o.rules ?? []]));
  const groups = ['system:serviceaccounts', `system:serviceaccounts:${sa.namespace}`, 'system:authenticated'];
  const boundTo = (b: Obj, bindingNs: string | undefined) =>
    (b.subjects ?? []).some(
      (s) =>
        (s.kind === 'ServiceAccount' && s.name === sa.name && (s.namespace ?? bindingNs) === sa.namespace) ||
        (s.kind === 'Group' && groups.includes(s.name ?? '')) ||
        (s.kind === 'User' && s.name === serviceAccountUser(sa)),
    );
  const policy: RbacPolicy = { cluster: [], namespaced: new Map() };
  for (const b of objs) {
    if (b.kind === 'ClusterRoleBinding' && boundTo(b, undefined) && b.roleRef?.kind === 'ClusterRole') {
      policy.cluster.push(...(clusterRoles.get(b.roleRef.name ?? '') ?? []));
    }
    if (b.kind === 'RoleBinding') {
      const ns = b.metadata?.namespace ?? 'default';
      if (!boundTo(b, ns)) continue;
      const rules = b.roleRef?.kind === 'ClusterRole' ? clusterRoles.get(b.roleRef.name ?? '') : roles.get(`${ns}/${b.roleRef?.name ?? ''}`);
      const list = policy.namespaced.get(ns) ?? [];
      list.push(...(rules ?? []));
      policy.namespaced.set(ns, list);
    }
  }
  return policy;
}

export function allows(policy: RbacPolicy, a: RequestAttributes): boolean {
  if (policy.cluster.some((r) => ruleAllows(r, a))) return true;
  return a.namespace !== '' && (policy.namespaced.get(a.namespace) ?? []).some((r) => ruleAllows(r, a));
}

// apiserver's responsewriters.forbiddenMessage and errors.NewForbidden:
// `secrets "s" is forbidden: User "…" cannot get resource "secrets" in API
// group "" in the namespace "x"`.
export function forbiddenStatus(user: string, a: RequestAttributes): Record<string, unknown> {
  const resource = a.subresource ? `${a.resource}/${a.subresource}` : a.resource;
  const scope = a.namespace ? `in the namespace "${a.namespace}"` : 'at the cluster scope';
  const why = `User "${user}" cannot ${a.verb} resource "${resource}" in API group "${a.apiGroup}" ${scope}`;
  const qualified = a.apiGroup ? `${a.resource}.${a.apiGroup}` : a.resource;
  const message = a.name ? `${qualified} "${a.name}" is forbidden: ${why}` : `${qualified} is forbidden: ${why}`;
  return {
    kind: 'Status',
    apiVersion: 'v1',
    metadata: {},
    status: 'Failure',
    message,
    reason: 'Forbidden',
    details: { ...(a.name ? { name: a.name } : {}), group: a.apiGroup, kind: a.resource },
    code: 403,
  };
}

// A namespaced install as far as RBAC goes: the manifest ClusterRole's rules
// (manifests/daemonset.yaml unless given) as a Role in each namespace, bound
// to the agent's service account there; nothing at the cluster scope.
export function namespacedRbac(namespaces: string[], rules?: PolicyRule[]): unknown[] {
  const roleRules =
    rules ??
    ((loadManifestObjects(new URL('../../manifests/daemonset.yaml', import.meta.url).pathname) as Obj[]).find((o) => o.kind === 'ClusterRole')?.rules ?? []);
  return namespaces.flatMap((ns) => [
    { apiVersion: 'rbac.authorization.k8s.io/v1', kind: 'Role', metadata: { name: 'vmseed-agent', namespace: ns }, rules: roleRules },
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'RoleBinding',
      metadata: { name: 'vmseed-agent', namespace: ns },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'vmseed-agent' },
      subjects: [{ kind: 'ServiceAccount', name: AGENT_SERVICE_ACCOUNT.name, namespace: AGENT_SERVICE_ACCOUNT.namespace }],
    },
  ]);
}
