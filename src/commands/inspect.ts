// `vmseed inspect IMAGE.iso [--cat NAME]`: what a guest would find on a
// seed image, read with our own reader (any ISO 9660 seed, not only ours).
import { readFile } from 'node:fs/promises';
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import type { Command, CliContext, ExitCode } from './cli.ts';
import { VmseedError } from '../errors.ts';
import { readIso, type IsoImage } from '../disk/iso9660-read.ts';

/** `vmseed inspect --help`. */
export const INSPECT_USAGE = 'usage: vmseed inspect IMAGE.iso [--cat NAME]\n';

/**
 * What cloud-init would take the image for: the label matches exactly, in one of
 * the two cases cloud-init accepts, and the files it requires are there.
 */
export function guessDatasource(img: IsoImage): 'nocloud' | 'configdrive' | 'unknown' {
  const has = (p: string) => img.entries.some((e) => e.kind === 'file' && e.path === p);
  if ((img.label === 'cidata' || img.label === 'CIDATA') && has('user-data') && has('meta-data')) return 'nocloud';
  if ((img.label === 'config-2' || img.label === 'CONFIG-2') && has('openstack/latest/meta_data.json'))
    return 'configdrive';
  return 'unknown';
}

/**
 * `vmseed inspect`: an ISO 9660 image's label, datasource guess and files, or
 * one file's bytes with --cat. Exit 2 for an unreadable image or a missing file.
 */
export const inspect: Command = async (ctx): Promise<ExitCode> => {
  let parsed;
  try {
    parsed = parseArgs({
      args: ctx.argv,
      options: { cat: { type: 'string' }, help: { type: 'boolean', short: 'h' } },
      allowPositionals: true,
      strict: true,
    });
  } catch (e) {
    return usage(ctx, (e as Error).message);
  }
  if (parsed.values.help) {
    ctx.stdout.write(INSPECT_USAGE);
    return 0;
  }
  if (parsed.positionals.length !== 1) return usage(ctx, 'give exactly one image file');
  const file = parsed.positionals[0];
  let img: IsoImage;
  try {
    img = readIso(new Uint8Array(await readFile(resolve(ctx.cwd, file))));
  } catch (e) {
    if (e instanceof VmseedError) return usage(ctx, `${file}: ${e.code}: ${e.message}`);
    return usage(ctx, `${file}: cannot read it (${(e as { code?: string }).code ?? 'error'})`);
  }
  const cat = parsed.values.cat;
  if (cat !== undefined) {
    const data = img.read(cat);
    if (data === undefined) return usage(ctx, `${file}: no file '${cat}' in the image (see 'vmseed inspect ${file}')`);
    await new Promise<void>((ok, ko) => ctx.stdout.write(data, (err) => (err ? ko(err) : ok())));
    return 0;
  }
  const ext =
    [img.extensions.joliet ? 'joliet' : '', img.extensions.rockRidge ? 'rockridge' : ''].filter(Boolean).join(' ') ||
    'none';
  const lines = [
    `label:      ${img.label}`,
    `datasource: ${guessDatasource(img)}`,
    `extensions: ${ext} (names from ${img.namesFrom})`,
    `size:       ${img.volumeSectors * 2048} bytes (${img.volumeSectors} sectors)`,
    'files:',
    ...img.entries.filter((e) => e.kind === 'file').map((e) => `  ${String(e.size).padStart(10)}  ${e.path}`),
  ];
  ctx.stdout.write(lines.join('\n') + '\n');
  return 0;
};

function usage(ctx: CliContext, msg: string): ExitCode {
  ctx.stderr.write(`vmseed inspect: ${msg}\n`);
  return 2;
}

export default inspect;
