// ValidatingAdmissionPolicies (admissionregistration.k8s.io/v1) evaluated
// the way the API server's ValidatingAdmissionPolicy admission plugin does
// (k8s.io/apiserver/pkg/admission/plugin/policy/validating), with a real CEL
// implementation (@bufbuild/cel): for each policy whose matchConstraints
// match the request, each binding of it (whose matchResources match too):
// the matchConditions (any false: not applied; an error: a denial under
// failurePolicy Fail), then the variables, then every validation in order.
// A validation false is a denial with its reason (default Invalid); an
// evaluation error is one too under failurePolicy Fail (reason Invalid).
// The first denial of a binding with validationActions Deny refuses the
// request with the plugin's Status (dispatcher.go):
//   code: reasonToCode(reason) (Forbidden 403, Unauthorized 401,
//     RequestEntityTooLarge 413, Invalid and anything else 422)
//   message: `<resource>.<group> "<name>" is forbidden: ValidatingAdmissionPolicy
//     '<policy>' with binding '<binding>' denied request: <validation message>`
//     (admission.NewForbidden wraps it, apierrors.NewForbidden words it)
//   details: name, group, kind (the resource), causes [{message: the inner message}].
// The activation is the API server's: `object` and `oldObject` as
// unstructured maps (JSON integers are CEL ints), `request` the
// AdmissionRequest as JSON (userInfo.extra left out when empty, as
// `omitempty` does), `params` null, `namespaceObject` the request's Namespace.
// Not modelled (an error if a policy asks for it): paramKind, non-empty
// namespaceSelector/objectSelector, messageExpression, auditAnnotations.
import { celEnv, isCelError, parse, plan, type CelInput } from '@bufbuild/cel';

export interface NamedExpression {
  name: string;
  expression: string;
}
export interface Validation {
  expression: string;
  message?: string;
  reason?: string;
  messageExpression?: string;
}
export interface ResourceRule {
  apiGroups?: string[];
  apiVersions?: string[];
  operations?: string[];
  resources?: string[];
  resourceNames?: string[];
  scope?: string;
}
export interface MatchResources {
  resourceRules?: ResourceRule[];
  excludeResourceRules?: ResourceRule[];
  namespaceSelector?: Record<string, unknown>;
  objectSelector?: Record<string, unknown>;
  matchPolicy?: string;
}
export interface AdmissionPolicy {
  apiVersion?: string;
  kind?: string;
  metadata: { name: string; labels?: Record<string, string> };
  spec: {
    failurePolicy?: string;
    paramKind?: unknown;
    matchConstraints?: MatchResources;
    matchConditions?: NamedExpression[];
    variables?: NamedExpression[];
    validations?: Validation[];
    auditAnnotations?: unknown;
  };
}
export interface AdmissionPolicyBinding {
  apiVersion?: string;
  kind?: string;
  metadata: { name: string };
  spec: {
    policyName: string;
    validationActions?: string[];
    paramRef?: unknown;
    matchResources?: MatchResources;
  };
}

export interface UserInfo {
  username: string;
  uid?: string;
  groups?: string[];
  extra?: Record<string, string[]>;
}

/** What admission knows of one request (admission.Attributes). */
export interface AdmissionAttributes {
  resource: { group: string; version: string; resource: string };
  subResource?: string;
  kind: { group: string; version: string; kind: string };
  name: string;
  namespace?: string;
  operation: 'CREATE' | 'UPDATE' | 'DELETE' | 'CONNECT';
  userInfo: UserInfo;
  object: unknown;
  oldObject: unknown;
  // The request's Namespace object (default: one with only its name label).
  namespaceObject?: unknown;
  // CreateOptions, UpdateOptions (a PATCH is admitted as an UPDATE), DeleteOptions.
  options?: unknown;
  dryRun?: boolean;
  uid?: string;
}

export interface Denial {
  // Index of the validation (or -1: a matchCondition or configuration error).
  index: number;
  reason: string;
  message: string;
  // true: an evaluation error (failurePolicy Fail), not a validation false.
  error: boolean;
}

export interface PolicyDecision {
  matched: boolean;
  // Evaluation errors (a refusal under failurePolicy: Fail).
  errors: string[];
  // Validations that evaluated to false, in order.
  failed: Array<{ index: number; expression: string; reason: string; message: string }>;
  // Everything that refuses, in the order the API server meets it.
  denials: Denial[];
  allowed: boolean;
}

// --- CEL ---------------------------------------------------------------------

// JSON as the API server hands it to CEL: objects are maps, integers ints.
export function toCel(value: unknown): CelInput {
  if (Array.isArray(value)) return value.map(toCel);
  if (typeof value === 'number') return Number.isInteger(value) ? BigInt(value) : value;
  if (value !== null && typeof value === 'object') return new Map(Object.entries(value).map(([k, v]) => [k, toCel(v)]));
  return value as CelInput;
}

const compiled = new Map<string, ReturnType<typeof plan>>();
export function evaluate(expression: string, bindings: Record<string, CelInput>): unknown {
  let program = compiled.get(expression);
  if (!program) compiled.set(expression, (program = plan(celEnv(), parse(expression))));
  return program(bindings);
}

const errorText = (out: unknown) => (isCelError(out) ? out.message : `no boolean: ${String(out)}`);

// --- the request ---------------------------------------------------------------

// The AdmissionRequest (admission.k8s.io/v1) as the API server builds it for
// CEL (cel.CreateAdmissionRequest): kind/resource of the request, the user,
// the operation and its options.
export function admissionRequest(a: AdmissionAttributes): Record<string, unknown> {
  const userInfo: Record<string, unknown> = { username: a.userInfo.username };
  if (a.userInfo.uid) userInfo.uid = a.userInfo.uid;
  if (a.userInfo.groups?.length) userInfo.groups = a.userInfo.groups;
  if (a.userInfo.extra && Object.keys(a.userInfo.extra).length > 0) userInfo.extra = a.userInfo.extra;
  return {
    uid: a.uid ?? '5b8c2f3e-2d0a-4a53-8f77-3e0c1f1b9b21',
    kind: a.kind,
    resource: a.resource,
    ...(a.subResource ? { subResource: a.subResource } : {}),
    requestKind: a.kind,
    requestResource: a.resource,
    ...(a.subResource ? { requestSubResource: a.subResource } : {}),
    name: a.name,
    ...(a.namespace ? { namespace: a.namespace } : {}),
    operation: a.operation,
    userInfo,
    dryRun: a.dryRun ?? false,
    ...(a.options !== undefined ? { options: a.options } : {}),
  };
}

// --- matching ------------------------------------------------------------------

const has = (list: string[] | undefined, value: string) => (list ?? []).some((v) => v === '*' || v === value);

function resourceMatches(list: string[] | undefined, a: AdmissionAttributes): boolean {
  const name = a.subResource ? `${a.resource.resource}/${a.subResource}` : a.resource.resource;
  return (list ?? []).some((r) => {
    if (r === '*') return !a.subResource;
    if (r === '*/*') return true;
    const [res, sub] = r.split('/');
    if (sub === undefined) return r === name;
    if (res === '*') return a.subResource === sub;
    return res === a.resource.resource && (sub === '*' ? a.subResource !== undefined : sub === a.subResource);
  });
}

function ruleMatches(rule: ResourceRule, a: AdmissionAttributes): boolean {
  return (
    has(rule.apiGroups, a.resource.group) &&
    has(rule.apiVersions, a.resource.version) &&
    has(rule.operations, a.operation) &&
    resourceMatches(rule.resources, a) &&
    (!rule.resourceNames?.length || rule.resourceNames.includes(a.name))
  );
}

const emptySelector = (s: Record<string, unknown> | undefined) =>
  s === undefined ||
  ((s.matchLabels === undefined || Object.keys(s.matchLabels as object).length === 0) &&
    (s.matchExpressions === undefined || (s.matchExpressions as unknown[]).length === 0));

/** Whether match resources (a policy's matchConstraints, a binding's matchResources) take the request. */
export function matchResourcesMatch(m: MatchResources | undefined, a: AdmissionAttributes): boolean {
  if (m === undefined) return true;
  if (!emptySelector(m.namespaceSelector) || !emptySelector(m.objectSelector))
    throw new Error('admission-policy-eval: namespaceSelector/objectSelector with terms are not modelled');
  const rules = m.resourceRules;
  if (rules !== undefined && !rules.some((r) => ruleMatches(r, a))) return false;
  return !(m.excludeResourceRules ?? []).some((r) => ruleMatches(r, a));
}

// --- one policy ----------------------------------------------------------------

/** One policy (as if by one binding without matchResources) on one request. */
export function evaluatePolicy(policy: AdmissionPolicy, a: AdmissionAttributes): PolicyDecision {
  const { spec } = policy;
  if (spec.paramKind !== undefined) throw new Error('admission-policy-eval: paramKind is not modelled');
  const notMatched: PolicyDecision = { matched: false, errors: [], failed: [], denials: [], allowed: true };
  // A policy without matchConstraints.resourceRules matches nothing.
  if (!spec.matchConstraints?.resourceRules || !matchResourcesMatch(spec.matchConstraints, a)) return notMatched;
  const fail = (spec.failurePolicy ?? 'Fail') === 'Fail';
  const request = admissionRequest(a);
  const base: Record<string, CelInput> = {
    object: toCel(a.object ?? null),
    oldObject: toCel(a.oldObject ?? null),
    request: toCel(request),
    params: null,
    namespaceObject: a.namespace
      ? toCel(
          a.namespaceObject ?? {
            apiVersion: 'v1',
            kind: 'Namespace',
            metadata: { name: a.namespace, labels: { 'kubernetes.io/metadata.name': a.namespace } },
          },
        )
      : null,
  };
  const errors: string[] = [];
  const denials: Denial[] = [];
  const errorDenial = (index: number, message: string) => {
    errors.push(message);
    if (fail) denials.push({ index, reason: 'Invalid', message, error: true });
  };
  for (const c of spec.matchConditions ?? []) {
    const out = evaluate(c.expression, base);
    if (out === false) return notMatched;
    if (out !== true) errorDenial(-1, `matchCondition ${c.name}: ${errorText(out)}`);
  }
  if (errors.length > 0) return { matched: true, errors, failed: [], denials, allowed: denials.length === 0 };
  const variables = new Map<string, CelInput>();
  for (const v of spec.variables ?? []) {
    const out = evaluate(v.expression, { ...base, variables });
    // A variable that fails fails the validations that read it.
    if (isCelError(out)) errors.push(`variable ${v.name}: ${out.message}`);
    else variables.set(v.name, out as CelInput);
  }
  const failed: PolicyDecision['failed'] = [];
  (spec.validations ?? []).forEach((v, index) => {
    if (v.messageExpression !== undefined) throw new Error('admission-policy-eval: messageExpression is not modelled');
    const out = evaluate(v.expression, { ...base, variables });
    if (out === true) return;
    if (out === false) {
      const reason = v.reason ?? 'Invalid';
      const message = v.message?.trim() || `failed expression: ${v.expression.trim()}`;
      failed.push({ index, expression: v.expression, reason, message });
      denials.push({ index, reason, message, error: false });
      return;
    }
    errorDenial(index, `expression '${v.expression}' resulted in error: ${errorText(out)}`);
  });
  return { matched: true, errors, failed, denials, allowed: denials.length === 0 };
}

// --- the plugin ----------------------------------------------------------------

// metav1.StatusReason → HTTP code, as the plugin's reasonToCode.
export function reasonToCode(reason: string): number {
  switch (reason) {
    case 'Forbidden':
      return 403;
    case 'Unauthorized':
      return 401;
    case 'RequestEntityTooLarge':
      return 413;
    default:
      return 422;
  }
}

export interface Refusal {
  code: number;
  // The Status body the API server answers with.
  status: Record<string, unknown>;
  policy: string;
  binding: string;
  denial: Denial;
}

/**
 * The ValidatingAdmissionPolicy plugin: every binding of a stored policy
 * applied to the request; undefined: admitted. Only bindings with
 * validationActions Deny refuse (Warn and Audit do not).
 */
export function admitByPolicies(
  policies: AdmissionPolicy[],
  bindings: AdmissionPolicyBinding[],
  a: AdmissionAttributes,
): Refusal | undefined {
  for (const policy of policies) {
    for (const binding of bindings.filter((b) => b.spec.policyName === policy.metadata.name)) {
      if (!(binding.spec.validationActions ?? []).includes('Deny')) continue;
      if (!matchResourcesMatch(binding.spec.matchResources, a)) continue;
      const decision = evaluatePolicy(policy, a);
      const [denial] = decision.denials;
      if (denial) return refusal(policy.metadata.name, binding.metadata.name, denial, a);
    }
  }
  return undefined;
}

function refusal(policy: string, binding: string, denial: Denial, a: AdmissionAttributes): Refusal {
  const inner = `ValidatingAdmissionPolicy '${policy}' with binding '${binding}' denied request: ${denial.message}`;
  const qualified = a.resource.group ? `${a.resource.resource}.${a.resource.group}` : a.resource.resource;
  const code = reasonToCode(denial.reason);
  return {
    code,
    policy,
    binding,
    denial,
    status: {
      kind: 'Status',
      apiVersion: 'v1',
      metadata: {},
      status: 'Failure',
      message: `${qualified} "${a.name}" is forbidden: ${inner}`,
      reason: denial.reason,
      details: { name: a.name, group: a.resource.group, kind: a.resource.resource, causes: [{ message: inner }] },
      code,
    },
  };
}
