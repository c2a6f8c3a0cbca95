// The per-VMI templates of the libvirt side (connection URI, domain name,
// image path in the domain, publish directory): {namespace} {name} {uid}
// {datasource} {podUID}, and for image paths {path} {basename}. A template
// is made by parseTemplate only, which checks its placeholders (once, where
// the flags are read); the injector and the publisher take Templates of
// their kind, so neither an unchecked string nor a template of another use
// reaches them.
import { VmseedError } from '../errors.ts';
import { launcherPodOf } from './launcher-pod.ts';
import type { InjectionTarget } from './injector-contract.ts';

export const TARGET_PLACEHOLDERS = ['namespace', 'name', 'uid', 'datasource', 'podUID'] as const;
export const IMAGE_PLACEHOLDERS = [...TARGET_PLACEHOLDERS, 'path', 'basename'] as const;

export type TemplateVars = Partial<Record<(typeof IMAGE_PLACEHOLDERS)[number], string>>;

// What each template is for, and the placeholders it may use.
export const TEMPLATE_PLACEHOLDERS = {
  uri: TARGET_PLACEHOLDERS,
  domain: TARGET_PLACEHOLDERS,
  'image-path': IMAGE_PLACEHOLDERS,
  'publish-dir': TARGET_PLACEHOLDERS,
} as const;

/** What a template is for: `uri`, `domain`, `image-path` or `publish-dir`. */
export type TemplateKind = keyof typeof TEMPLATE_PLACEHOLDERS;

/** A checked template of one kind (the brand exists only for the type checker). */
export type Template<K extends TemplateKind> = string & { readonly __template: K };

// Why `text` is no template of `kind` (in words for the flag that gave it),
// or undefined.
export function templateProblem(kind: TemplateKind, text: string): string | undefined {
  const allowed: readonly string[] = TEMPLATE_PLACEHOLDERS[kind];
  for (const [, name] of text.matchAll(/\{([^}]*)\}/g)) {
    if (!allowed.includes(name)) return `unknown placeholder {${name}}; use ${allowed.map((a) => `{${a}}`).join(', ')}`;
  }
  if (text.trim() === '') return 'must not be empty';
  return undefined;
}

/**
 * The one way to make a Template. `fail` makes the caller's error of the
 * problem (the flag's ConfigError); by default VmseedError CONFIG_INVALID.
 */
export function parseTemplate<K extends TemplateKind>(
  kind: K,
  text: string,
  fail: (problem: string) => Error = (problem) =>
    new VmseedError('CONFIG_INVALID', `${kind} template '${text}': ${problem}`, { kind: 'terminal', field: kind }),
): Template<K> {
  const problem = templateProblem(kind, text);
  if (problem !== undefined) throw fail(problem);
  return text as Template<K>;
}

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

/**
 * A value placed into a libvirt URI (e.g. the socket path of
 * `qemu+unix:///session?socket=...`): libvirt unescapes query values
 * (virURIParseParams), so everything but unreserved characters and `/` is
 * percent-encoded and cannot start another parameter or end the URI.
 */
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
