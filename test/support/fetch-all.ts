// Fetches every route of a running vmseed HTTP server and returns all the
// bodies, for tests that assert something (a secret marker) never appears.
export interface FetchedRoute {
  path: string;
  status: number;
  contentType: string;
  headers: Record<string, string>;
  body: string;
}

const STATES = ['error', 'warning', 'pending', 'ready', 'skipped'];

export async function fetchAll(baseUrl: string): Promise<FetchedRoute[]> {
  const get = async (path: string): Promise<FetchedRoute> => {
    const res = await fetch(new URL(path, baseUrl), { redirect: 'manual' });
    return {
      path,
      status: res.status,
      contentType: res.headers.get('content-type') ?? '',
      headers: Object.fromEntries(res.headers.entries()),
      body: await res.text(),
    };
  };
  const fixed = [
    '/',
    '/metrics',
    '/healthz',
    '/readyz',
    '/status',
    '/status/',
    '/status.json',
    '/status/no-such-ns/no-such-vmi',
    '/no-such-page',
  ];
  for (const s of STATES) fixed.push(`/status?state=${s}`, `/status.json?state=${s}`);
  const out: FetchedRoute[] = [];
  for (const p of fixed) out.push(await get(p));
  const index = out.find((r) => r.path === '/status.json');
  if (index?.status === 200) {
    const vmis = (JSON.parse(index.body) as { vmis: Array<{ namespace: string; name: string }> }).vmis;
    for (const v of vmis)
      out.push(await get(`/status/${encodeURIComponent(v.namespace)}/${encodeURIComponent(v.name)}`));
  }
  return out;
}
