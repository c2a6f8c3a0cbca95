// The agent's NoCloud HTTP datasource for in-process agent tests, on port 0:
// the kernel picks a free port in the listener's own bind. (A port picked
// beforehand and closed again can be taken by another process before the
// listener binds it.) Where it listens is known once it does: baseUrl.
import type { Agent } from '../../src/agent/controller.ts';
import type { DatasourceConfig, NocloudHttp } from '../../src/commands/agent/datasource.ts';

// Where guests reach the datasource (what seeds and serials carry), the
// default of --datasource-base-url; not where the test's listener is.
export const GUEST_BASE_URL = 'http://169.254.169.254/v1';

/** prepareNocloudHttp's settings for a loopback listener on port 0 under /v1. */
export function loopbackDatasource(
  keyFile: string,
  extra: Partial<Omit<DatasourceConfig, 'listen' | 'keyFile' | 'baseUrl' | 'prefix'>> = {},
): DatasourceConfig {
  return {
    listen: { host: '127.0.0.1', port: 0 },
    keyFile,
    baseUrl: GUEST_BASE_URL,
    prefix: '/v1',
    compatSourceAddress: false,
    ...extra,
  };
}

export interface StartedDatasource {
  /** For startAgent's beforeStart: starts the listener over the agent's seeds. */
  beforeStart(agent: Agent): Promise<void>;
  /** `http://127.0.0.1:<port>/v1`, once beforeStart has run. */
  readonly baseUrl: string;
  close(): Promise<void>;
}

export function startedDatasource(ds: NocloudHttp): StartedDatasource {
  let started: Awaited<ReturnType<NocloudHttp['start']>> | undefined;
  return {
    beforeStart: async (agent) => {
      started = await ds.start(agent);
    },
    get baseUrl() {
      if (!started) throw new Error('the datasource is not listening yet (startAgent runs beforeStart)');
      return started.server.baseUrl;
    },
    close: async () => {
      await started?.close();
    },
  };
}
