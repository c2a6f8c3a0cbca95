// vmseed's version, from package.json: `vmseed --version`, the agent's log,
// /status.json and vmseed_build_info all read it here.
import { createRequire } from 'node:module';

/** vmseed's version, from package.json. */
export const VERSION = (createRequire(import.meta.url)('../../package.json') as { version: string }).version;

/**
 * What `vmseed --version` prints: ours and the runtime's, since the image pins
 * both.
 */
export function versionLine(): string {
  return `vmseed ${VERSION} (Node.js ${process.version})\n`;
}
