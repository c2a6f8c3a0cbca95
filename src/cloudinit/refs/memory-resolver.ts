// RefResolver over objects held in memory (local mode, `vmseed build`, tests).
import type { ConfigMapObject, RefResolver, SecretObject } from '../../api/objects.ts';

const key = (namespace: string, name: string) => `${namespace}/${name}`;

/** A RefResolver over Secrets and ConfigMaps held in memory; an object without namespace is in "default". */
export class MemoryResolver implements RefResolver {
  readonly #secrets = new Map<string, SecretObject>();
  readonly #configMaps = new Map<string, ConfigMapObject>();

  constructor(objects: { secrets?: Iterable<SecretObject>; configMaps?: Iterable<ConfigMapObject> } = {}) {
    for (const s of objects.secrets ?? []) this.putSecret(s);
    for (const c of objects.configMaps ?? []) this.putConfigMap(c);
  }

  // Later objects with the same namespace/name replace earlier ones, like kubectl apply.
  putSecret(secret: SecretObject): void {
    this.#secrets.set(key(secret.metadata.namespace ?? 'default', secret.metadata.name), secret);
  }

  putConfigMap(configMap: ConfigMapObject): void {
    this.#configMaps.set(key(configMap.metadata.namespace ?? 'default', configMap.metadata.name), configMap);
  }

  deleteSecret(namespace: string, name: string): boolean {
    return this.#secrets.delete(key(namespace, name));
  }

  deleteConfigMap(namespace: string, name: string): boolean {
    return this.#configMaps.delete(key(namespace, name));
  }

  getSecret(namespace: string, name: string): Promise<SecretObject | undefined> {
    return Promise.resolve(this.#secrets.get(key(namespace, name)));
  }

  getConfigMap(namespace: string, name: string): Promise<ConfigMapObject | undefined> {
    return Promise.resolve(this.#configMaps.get(key(namespace, name)));
  }
}
