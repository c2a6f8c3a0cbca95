// The API server's RBAC authorizer, for the fake API server: the rules the
// manifests grant one service account (ClusterRole via ClusterRoleBinding
// everywhere; Role or ClusterRole via RoleBinding in the binding's namespace
// only), and the Forbidden Status Kubernetes answers when no rule allows a
// request. Bindings and rule matching are rbac.ts's, the same the
// deployment tests check the manifests with.
import { readFileSync } from 'node:fs';
import { loadAll } from 'js-yaml';
import {
  rulesOfServiceAccount,
  scopedAllows,
  type PolicyRule,
  type RequestAttributes,
  type ScopedRules,
} from './rbac.ts';

export interface ServiceAccountRef {
  namespace: string;
  name: string;
}

// What one service account holds, binding by binding.
export interface RbacPolicy {
  bindings: ScopedRules[];
}

interface Obj {
  kind?: string;
  rules?: PolicyRule[];
}

export const AGENT_SERVICE_ACCOUNT: ServiceAccountRef = { namespace: 'vmseed', name: 'vmseed' };

export function serviceAccountUser(sa: ServiceAccountRef): string {
  return `system:serviceaccount:${sa.namespace}:${sa.name}`;
}

export function loadManifestObjects(path: string): unknown[] {
  return loadAll(readFileSync(path, 'utf8')).filter((d) => d !== null && d !== undefined);
}

export function rbacFromManifests(objects: unknown[], sa: ServiceAccountRef = AGENT_SERVICE_ACCOUNT): RbacPolicy {
  return { bindings: rulesOfServiceAccount(objects, sa) };
}

export function allows(policy: RbacPolicy, a: RequestAttributes): boolean {
  return scopedAllows(policy.bindings, a);
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
  // Default: what the agent holds when it reads and unpauses itself (the
  // base's ClusterRole and the direct-reads component's).
  const clusterRoleRules = (file: string) =>
    (loadManifestObjects(new URL(`../../${file}`, import.meta.url).pathname) as Obj[]).find(
      (o) => o.kind === 'ClusterRole',
    )?.rules ?? [];
  const roleRules = rules ?? [
    ...clusterRoleRules('manifests/daemonset.yaml'),
    ...clusterRoleRules('deploy/components/direct-reads/clusterrole.yaml'),
  ];
  return namespaces.flatMap((ns) => [
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'Role',
      metadata: { name: 'vmseed-agent', namespace: ns },
      rules: roleRules,
    },
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'RoleBinding',
      metadata: { name: 'vmseed-agent', namespace: ns },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'vmseed-agent' },
      subjects: [
        { kind: 'ServiceAccount', name: AGENT_SERVICE_ACCOUNT.name, namespace: AGENT_SERVICE_ACCOUNT.namespace },
      ],
    },
  ]);
}

// The shipped objects (manifests/daemonset.yaml) with one verb taken off the
// ClusterRole's rule for `resource`: an install whose RBAC lags the agent.
export function manifestRbacWithout(resource: string, verb: string): unknown[] {
  return loadManifestObjects(new URL('../../manifests/daemonset.yaml', import.meta.url).pathname).map((o) => {
    const obj = o as Obj;
    if (obj.kind !== 'ClusterRole') return o;
    const rules = (obj.rules ?? []).map((r) =>
      r.resources?.includes(resource) ? { ...r, verbs: r.verbs.filter((v) => v !== verb) } : r,
    );
    return { ...obj, rules };
  });
}
