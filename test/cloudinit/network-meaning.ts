// What a network config means to cloud-init, spelling aside, from the
// network state oracle.py summarises: per NIC (by MAC, else name) the address
// set, DHCP/RA modes, default gateways, other routes, MTU; DNS servers and
// search domains wherever they sit.
import type { NetworkStateSummary } from './corpus-lib.ts';

export function meaning(state: NetworkStateSummary) {
  const kind = (t: string) =>
    (
      ({
        dhcp: 'dhcp4',
        static6: 'static',
        'ipv6_dhcpv6-stateful': 'dhcp6',
        'ipv6_dhcpv6-stateless': 'ra',
        ipv6_slaac: 'ra',
      }) as Record<string, string>
    )[t] ?? t;
  const ifaces = state.interfaces
    .map((i) => {
      const modes = new Set(i.subnets.map((s) => kind(s.type)).filter((t) => t !== 'static'));
      if (i['accept-ra']) modes.add('ra');
      if (modes.has('dhcp6')) modes.add('ra');
      const routes = i.subnets.flatMap((s) => [
        ...(s.gateway ? [`default via ${s.gateway}`] : []),
        ...s.routes.map((r) =>
          r.prefix === 0 ? `default via ${r.gateway}` : `${r.network}/${r.prefix} via ${r.gateway}`,
        ),
      ]);
      return {
        key: i.mac ?? i.name,
        mtu: i.mtu ?? null,
        addresses: i.subnets
          .filter((s) => s.address)
          .map((s) => `${s.address}/${s.prefix}`)
          .sort(),
        modes: [...modes].sort(),
        routes: [...new Set(routes)].sort(),
      };
    })
    .sort((a, b) => String(a.key).localeCompare(String(b.key)));
  const servers = new Set([
    ...state.dns.nameservers,
    ...state.interfaces.flatMap((i) => i.subnets.flatMap((s) => s.dns_nameservers)),
  ]);
  const search = new Set([
    ...state.dns.search,
    ...state.interfaces.flatMap((i) => i.subnets.flatMap((s) => s.dns_search)),
  ]);
  return { ifaces, dns: [...servers].sort(), search: [...search].sort() };
}
