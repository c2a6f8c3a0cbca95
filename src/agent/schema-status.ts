// cloud-init's schemas as the agent finds them at start (schema-store.ts
// status()): which release seeds are checked against, or why none, for the
// log, the status page and vmseed_cloud_init_schema_info. A missing or
// unreadable directory turns the check off; it never stops the agent.
import type { CiProfile } from '../cloudinit/schema/ci-validator.ts';
import { CLOUD_INIT_RELEASES, schemaStore, type ReleaseStatus } from '../cloudinit/schema/schema-store.ts';

/** What the agent checks seeds against: the release (or off, with why) and the status page's line. */
export interface SchemaSetup {
  release: CiProfile | 'off';
  // Why seeds are not checked (release 'off').
  reason?: string;
  // "25.1 ready (25.1.4-1+deb13u1); 22.4 off: <why>", the selected release first.
  line: string;
  statuses: ReleaseStatus[];
}

/** Reads `dir`'s releases; `version` is --cloud-init-version. Never throws. */
export function schemaSetup(dir: string, version: CiProfile | 'off'): SchemaSetup {
  let statuses: ReleaseStatus[];
  try {
    statuses = schemaStore(dir).status();
  } catch (e) {
    const why = e instanceof Error ? e.message : String(e);
    statuses = CLOUD_INIT_RELEASES.map((release) => ({ release, state: 'off', reason: `${dir}: ${why}` }));
  }
  const ordered = [...statuses].sort((a, b) => Number(b.release === version) - Number(a.release === version));
  const releases = ordered
    .map((s) => (s.state === 'ready' ? `${s.release} ready (${s.version})` : `${s.release} off: ${s.reason}`))
    .join('; ');
  if (version === 'off') {
    const reason = 'off (--cloud-init-version off)';
    return { release: 'off', reason, line: `${releases}; seeds not checked: ${reason}`, statuses };
  }
  const selected = statuses.find((s) => s.release === version);
  if (!selected || selected.state !== 'ready') {
    const reason = `cloud-init ${version}'s schemas are off${selected?.state === 'off' ? `: ${selected.reason}` : ''}`;
    return { release: 'off', reason, line: `${releases}; seeds not checked: ${reason}`, statuses };
  }
  return { release: version, line: releases, statuses };
}
