// The per-VMI templates of the libvirt side (connection URI, domain name,
// image path in the domain, publish directory): {namespace} {name} {uid}
// {datasource} {podUID}, and for image paths {path} {basename}. Their
// placeholders are checked once, where the flags are read
// (config/values.ts checkTemplate); the injector and the publisher take
// them as they are.
import { launcherPodOf } from './launcher-pod.ts';
import type { InjectionTarget } from './types.ts';

export const TARGET_PLACEHOLDERS = ['namespace', 'name', 'uid', 'datasource', 'podUID'] as const;
export const IMAGE_PLACEHOLDERS = [...TARGET_PLACEHOLDERS, 'path', 'basename'] as const;

export type TemplateVars = Partial<Record<(typeof IMAGE_PLACEHOLDERS)[number], string>>;

export function usesPodUID(template: string): boolean {
  return template.includes('{podUID}');
}

export function renderTemplate(
  template: string,
  vars: TemplateVars,
  encode: (value: string) => string = (v) => v,
): string {
  return template.replace(/\{([a-zA-Z]+)\}/g, (whole, key: string) => {
    const v = (vars as Record<string, string | undefined>)[key];
    return v === undefined ? whole : encode(v);
  });
}

// A value placed into a libvirt URI (e.g. the socket path of
// `qemu+unix:///session?socket=...`): libvirt unescapes query values
// (virURIParseParams), so everything but unreserved characters and `/` is
// percent-encoded and cannot start another parameter or end the URI.
export function encodeUriValue(value: string): string {
  return Array.from(new TextEncoder().encode(value), (b) => {
    const c = String.fromCharCode(b);
    return /[A-Za-z0-9/._~-]/.test(c) ? c : `%${b.toString(16).toUpperCase().padStart(2, '0')}`;
  }).join('');
}

// {podUID} is resolved only when the template asks for it, so plain-libvirt
// templates never depend on KubeVirt's status.
export function renderForTarget(
  template: string,
  target: InjectionTarget,
  extra: TemplateVars = {},
  encode?: (value: string) => string,
): string {
  const vars: TemplateVars = {
    namespace: target.namespace,
    name: target.name,
    uid: target.uid,
    datasource: target.datasource,
    ...extra,
  };
  if (usesPodUID(template)) vars.podUID = launcherPodOf(target);
  return renderTemplate(template, vars, encode);
}
