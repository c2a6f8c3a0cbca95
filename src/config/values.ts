// The value checks of the flags: each turns one flag's text into its value
// or throws the one-line ConfigError printed before exiting 2.

/** A bad flag value; its message is the one line printed before exiting 2. */
export class ConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ConfigError';
  }
}

// Plain http only, no credentials: it is shown on the status page.
export function parseRedirectStatusUrl(text: string): string {
  let u: URL;
  try {
    u = new URL(text);
  } catch {
    throw new ConfigError(
      `--redirect-status-url: '${text}' is not a URL; give the redirect sidecar's readiness endpoint, e.g. http://127.0.0.1:8082/readyz`,
    );
  }
  if (u.protocol !== 'http:' || u.username || u.password || text.length > 512) {
    throw new ConfigError(
      "--redirect-status-url must be a plain http:// URL without credentials, at most 512 characters (the sidecar's /readyz, e.g. http://127.0.0.1:8082/readyz)",
    );
  }
  return u.href;
}

export function parseDuration(text: string, flag: string): number {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/.exec(text.trim());
  if (!m) throw new ConfigError(`--${flag}: '${text}' is not a duration; use e.g. 500ms, 30s, 5m or 1h`);
  const n = Number(m[1]);
  const unit = m[2] ?? 's';
  const ms = n * { ms: 1, s: 1000, m: 60_000, h: 3_600_000 }[unit]!;
  if (ms <= 0) throw new ConfigError(`--${flag}: must be greater than zero`);
  return Math.round(ms);
}

export function parseWholeNumber(text: string, flag: string, min: number, max: number): number {
  if (!/^\d+$/.test(text.trim())) throw new ConfigError(`--${flag}: '${text}' is not a whole number`);
  const n = Number(text);
  if (n < min || n > max) throw new ConfigError(`--${flag}: ${n} is out of range; use ${min}..${max}`);
  return n;
}

export function oneOf<T extends string>(text: string, flag: string, allowed: readonly T[]): T {
  if (!(allowed as readonly string[]).includes(text)) {
    throw new ConfigError(`--${flag}: '${text}' is not one of ${allowed.join(', ')}`);
  }
  return text as T;
}

/**
 * A HOST:PORT flag value (`[v6]:port` allowed, empty host is 0.0.0.0); throws
 * ConfigError naming --`flag`.
 */
export function parseListen(text: string, flag = 'listen'): { host: string; port: number } {
  const m = /^(?:\[([0-9a-fA-F:.]+)\]|([^:\s]*)):(\d+)$/.exec(text.trim());
  if (!m) throw new ConfigError(`--${flag}: '${text}' is not HOST:PORT (e.g. 127.0.0.1:8080 or :8080)`);
  const port = Number(m[3]);
  if (port > 65535) throw new ConfigError(`--${flag}: port ${port} is out of range; use 0..65535`);
  return { host: m[1] ?? (m[2] || '0.0.0.0'), port };
}

// `a,b`: DNS-1123 labels (what a namespace name is), each once.
const MAX_NAMESPACES = 100;
export function parseNamespaces(text: string): string[] {
  const names = text.split(',').map((n) => n.trim());
  if (names.length > MAX_NAMESPACES)
    throw new ConfigError(`--namespaces: ${names.length} namespaces; at most ${MAX_NAMESPACES} (two watches each)`);
  for (const n of names) {
    if (!/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/.test(n)) {
      throw new ConfigError(
        `--namespaces: '${n}' is not a namespace name (lowercase letters, digits and '-', at most 63); separate names with commas`,
      );
    }
  }
  return [...new Set(names)];
}

// A VmseedError from a shared parser becomes the one-line ConfigError.
export function checked<T>(fn: () => T): T {
  try {
    return fn();
  } catch (e) {
    throw new ConfigError((e as Error).message);
  }
}
