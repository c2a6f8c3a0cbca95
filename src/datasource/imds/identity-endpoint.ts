// `GET /v1/identity` as KubeVirt IMDS answers it (internal/imds/handlers.go):
// `{"namespace","serviceAccountName","vmName"}`, compact JSON and a newline
// (Go's json.Encoder), application/json. IMDS's sidecar takes the names from
// its launcher pod: the namespace, the `kubevirt.io/domain` label (the VMI's
// name) and the pod's spec.serviceAccountName.

/**
 * What the IMDS endpoints need to know of a VMI beyond its seed; the agent
 * fills it in (src/datasource/imds/facts.ts).
 */
export interface ImdsFacts {
  // IMDS-annotated (`imds.kubevirt.io/enabled: "true"`) or opted in with
  // `vmseed.io/imds: "true"`: only these are answered.
  enabled: boolean;
  // The ServiceAccount the launcher pod runs as, by KubeVirt's rule
  // (virt-controller's template.go): spec.serviceAccountName, else the
  // serviceAccount volume's, else `default`.
  serviceAccountName: string;
  // The VMI has a KubeVirt serviceAccount volume, so KubeVirt mounts the
  // ServiceAccount's token into the launcher pod; without one there is no
  // token to hand out.
  serviceAccountToken: boolean;
  // Launcher pod UIDs on this node (status.activePods), checked UUIDs; with
  // the node's pods watched, only the VMI's current launcher pods.
  launcherPods: string[];
  // Their names by UID, when the node's pods are watched: what /v1/token
  // checks a token's pod claims against.
  launcherPodNames?: Record<string, string>;
}

/** A complete IMDS answer; the caller adds Content-Length and the common headers. */
export interface ImdsReply {
  status: number;
  body: Uint8Array;
  headers: Record<string, string>;
}

export const JSON_TYPE = { 'Content-Type': 'application/json' } as const;

// Go's json.Encoder: compact, one trailing newline.
export function goJson(status: number, value: unknown, extra: Record<string, string> = {}): ImdsReply {
  return { status, body: Buffer.from(`${JSON.stringify(value)}\n`), headers: { ...JSON_TYPE, ...extra } };
}

// IMDS's writeError shape.
export function imdsError(status: number, error: string, message: string): ImdsReply {
  return goJson(status, { error, message });
}

export function identityReply(entry: { namespace: string; name: string }, facts: ImdsFacts): ImdsReply {
  return goJson(200, {
    namespace: entry.namespace,
    serviceAccountName: facts.serviceAccountName,
    vmName: entry.name,
  });
}
