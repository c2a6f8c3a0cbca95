// The annotation's Virtlet and oVirt fields read into user-data parts, before
// the composition merges them: `init` compiled (init/), `files` as
// write_files (userdata/write-files.ts), `userDataFrom`'s object read. The other
// extras (sshKeys, metaData, forceDHCP, vendorData…) are used as they are
// where the seed takes them.
import type { RefResolver, VmiObject } from '../../api/objects.ts';
import { instanceId } from '../kubevirt/instance-id.ts';
import type { SeedBudget } from '../limits.ts';
import type { NetModel } from '../network/model.ts';
import { compileInit, type CompiledInit } from '../init/init-compile.ts';
import { parseInit } from '../init/init-parse.ts';
import { deriveSalt, type SaltProvider } from '../init/password-salt.ts';
import { readObject } from '../refs/object-refs.ts';
import type { UserDataParts } from '../userdata/compose.ts';
import { virtletMerge } from '../userdata/merge.ts';
import { filesToWriteFiles } from '../userdata/write-files.ts';
import { ANNOTATION } from './annotation.ts';
import type { AnnotationExtras, UserDataFrom } from './extras.ts';

/** The annotation's extras with their references read, as the composition takes them. */
export interface ResolvedExtras {
  fields: AnnotationExtras;
  // init's cloud-config with files' write_files merged over it; an empty
  // mapping when neither is set.
  generated: Record<string, unknown>;
  from?: NonNullable<UserDataParts['from']>;
  // init.nics, for the network config.
  initNetwork?: NetModel;
}

export async function resolveExtras(
  vmi: VmiObject,
  extras: AnnotationExtras,
  namespace: string,
  refs: RefResolver,
  budget: SeedBudget,
  salt: SaltProvider | undefined,
): Promise<ResolvedExtras> {
  const init = extras.init ? await compileAnnotationInit(vmi, extras.init, namespace, refs, salt) : undefined;
  let generated: Record<string, unknown> = init?.cloudConfig ?? {};
  if (extras.files.length > 0) {
    const writeFiles = await filesToWriteFiles(extras.files, namespace, refs, ANNOTATION, budget);
    generated = virtletMerge(generated, { write_files: writeFiles }) as Record<string, unknown>;
  }
  const from = extras.userDataFrom ? await readUserDataFrom(extras.userDataFrom, namespace, refs) : undefined;
  return {
    fields: extras,
    generated,
    ...(from ? { from } : {}),
    ...(init?.network ? { initNetwork: init.network } : {}),
  };
}

async function compileAnnotationInit(
  vmi: VmiObject,
  init: Record<string, unknown>,
  namespace: string,
  refs: RefResolver,
  salt: SaltProvider | undefined,
): Promise<CompiledInit> {
  const prefix = `${ANNOTATION}.init`;
  return compileInit(parseInit(init, prefix), {
    namespace,
    vmiUid: vmi.metadata.uid || instanceId(vmi),
    refs,
    salt: salt ?? deriveSalt,
    prefix,
  });
}

async function readUserDataFrom(
  spec: UserDataFrom,
  namespace: string,
  refs: RefResolver,
): Promise<NonNullable<UserDataParts['from']>> {
  const field = `${ANNOTATION}.userDataFrom`;
  return { spec, entries: await readObject(refs, namespace, spec, field), field };
}
