// One render's view of referenced Secrets and ConfigMaps: each object is
// fetched once however many fields mention it (files[] with 100 entries
// naming one Secret made 100 API GETs and held 100 copies). A failure is
// remembered too, so the render fails once, fast. Made fresh for every
// render: a level-based reconcile must see the latest objects.
import type { ConfigMapObject, RefResolver, SecretObject } from '../../api/objects.ts';

export class MemoResolver implements RefResolver {
  readonly #inner: RefResolver;
  readonly #secrets = new Map<string, Promise<SecretObject | undefined>>();
  readonly #configMaps = new Map<string, Promise<ConfigMapObject | undefined>>();

  constructor(inner: RefResolver) {
    this.#inner = inner;
  }

  // Fetches made through this view (tests, the bench).
  get fetches(): number {
    return this.#secrets.size + this.#configMaps.size;
  }

  getSecret(namespace: string, name: string): Promise<SecretObject | undefined> {
    return once(this.#secrets, `${namespace}/${name}`, () => this.#inner.getSecret(namespace, name));
  }

  getConfigMap(namespace: string, name: string): Promise<ConfigMapObject | undefined> {
    return once(this.#configMaps, `${namespace}/${name}`, () => this.#inner.getConfigMap(namespace, name));
  }
}

function once<T>(memo: Map<string, Promise<T>>, key: string, fetch: () => Promise<T>): Promise<T> {
  let p = memo.get(key);
  if (p === undefined) {
    p = fetch();
    memo.set(key, p);
  }
  return p;
}

/**
 * One render's view of `refs` (each object fetched once, a failure remembered), or `refs` itself
 * when it already is one. Make a new one per render, so each sees the latest objects.
 */
export function memoize(refs: RefResolver): RefResolver {
  return refs instanceof MemoResolver ? refs : new MemoResolver(refs);
}
