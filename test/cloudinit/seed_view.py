"""What cloud-init makes of a seed, by its own code: the view a guest gets.

stdin: JSON [{"id", "dir", "datasource": "nocloud"|"configdrive", "asked"?: {"userData"?, "networkData"?}}]
stdout: JSON [{"id", "ok", "error"?, "hostname", "users", "sshKeys", "files" (path: base64), "runcmd", "network",
               "config", "parts", "asked"?: {"config", "parts", "network"}}]

"asked" holds what the VMI itself gives (base64 of its user-data and
network data, taken from its manifests): the same readers make of it the
merged cloud-config, the list of parts and the network state, to set beside
what they make of the seed.

The seed is read as the datasource reads it (util.pathprefix2dict +
load_yaml for NoCloud, ConfigDriveReader.read_v2 for ConfigDrive); its
user-data goes through UserDataProcessor (MIME, gzip, #include-less parts)
and CloudConfigPartHandler, which merges the #cloud-config parts as
cloud-init does; users through ug_util.normalize_users_groups on a Debian
distro; files through cc_write_files' own decoder; the network config
through parse_net_config_data (convert_net_json first for ConfigDrive).
"""
import base64
import copy
import hashlib
import json
import logging
import os
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore", category=DeprecationWarning)
logging.disable(logging.CRITICAL)

from cloudinit import distros, handlers, helpers, sources, url_helper, user_data, util  # noqa: E402
from cloudinit.config import cc_write_files  # noqa: E402
from cloudinit.distros import ug_util  # noqa: E402
from cloudinit.handlers.cloud_config import CloudConfigPartHandler  # noqa: E402
from cloudinit.net import network_state  # noqa: E402
from cloudinit.sources.helpers import openstack  # noqa: E402
from cloudinit.sources.helpers.openstack import ConfigDriveReader  # noqa: E402


# network_data.json's DHCPv6 type; cloud-init's netplan renderer turns it
# into dhcp6: true, as it does NoCloud's dhcp6.
DYNAMIC = {"ipv6_dhcpv6-stateful": "dhcp6"}


def read_seed(item):
    if item["datasource"] == "nocloud":
        seeded = util.pathprefix2dict(
            item["dir"], required=["user-data", "meta-data"], optional=["vendor-data", "network-config"]
        )
        md = util.load_yaml(seeded["meta-data"], default={})
        net = None
        if "network-config" in seeded:
            net = util.load_yaml(seeded["network-config"], default=None)
            if isinstance(net, dict) and isinstance(net.get("network"), dict):
                net = net["network"]
        return md, seeded["user-data"], md.get("public-keys"), net
    res = ConfigDriveReader(item["dir"]).read_v2()
    md = res["metadata"]
    net = None
    nd = res.get("networkdata")
    if nd is not None:
        macs = {
            lk["ethernet_mac_address"].lower(): "eth%d" % i
            for i, lk in enumerate(nd.get("links", []))
            if lk.get("ethernet_mac_address")
        }
        net = openstack.convert_net_json(copy.deepcopy(nd), known_macs=macs)
    return md, res.get("userdata") or b"", md.get("public_keys"), net


class _Instance:
    # Paths.get_ipath asks the datasource for the instance directory's name.
    def get_instance_id(self):
        return "i-seed-view"


def _no_fetch(url, *args, **kwargs):
    # #include URLs: no network here; cloud-init reports an unreadable URL as this.
    raise url_helper.UrlError(OSError("no network in the oracle"), url=url)


def merged_cloud_config(ud, tmp):
    return processed(ud, tmp)[0]


def processed(ud, tmp):
    """The merged cloud-config and every part (content type, sha256 of its payload)."""
    paths = helpers.Paths({"cloud_dir": tmp, "run_dir": tmp}, ds=_Instance())
    msg = user_data.UserDataProcessor(paths).process(ud)
    parts = [
        [part.get_content_type(), hashlib.sha256(part.get_payload(decode=True) or b"").hexdigest()]
        for part in msg.walk()
        if not part.is_multipart()
    ]
    h = CloudConfigPartHandler(paths)
    h.handle_part(None, handlers.CONTENT_START, None, None, None, None)
    for part in msg.walk():
        if part.get_content_type() != "text/cloud-config":
            continue
        h.handle_part(
            None, "text/cloud-config", part.get_filename(), util.decode_binary(part.get_payload(decode=True)), None,
            dict(part.items()),
        )
    h.handle_part(None, handlers.CONTENT_END, None, None, None, None)
    with open(h.cloud_fn) as f:
        return util.load_yaml(f.read(), default={}) or {}, parts


def network_view(net):
    """Interfaces as network_state has them, or the error it raised."""
    try:
        st = network_state.parse_net_config_data(net, skip_broken=False)
    except Exception as e:  # noqa: BLE001
        return {"error": "%s: %s" % (type(e).__name__, e)}
    state = []
    for i in st.iter_interfaces():
        state.append({
            "name": i.get("name"),
            "mac": (i.get("mac_address") or "").lower() or None,
            "acceptRa": i.get("accept-ra"),
            "addresses": [
                "%s/%s" % (s.get("address"), s.get("prefix")) if s.get("prefix") is not None else s.get("address")
                for s in i.get("subnets", []) if s.get("address")
            ],
            "dhcp": [
                DYNAMIC.get(s.get("type"), s.get("type"))
                for s in i.get("subnets", [])
                if s.get("type") not in ("static", "static6", "manual")
            ],
        })
    return state


def network_from_text(raw):
    """Network data as a VMI gives it: network_data.json (converted as
    DataSourceConfigDrive does) or a NoCloud network-config (v1/v2, bare or
    under a top-level "network" key)."""
    text = util.decode_binary(raw)
    try:
        nd = json.loads(text)
    except ValueError:
        nd = None
    if isinstance(nd, dict) and "links" in nd:
        macs = {
            lk["ethernet_mac_address"].lower(): "eth%d" % i
            for i, lk in enumerate(nd.get("links", []))
            if lk.get("ethernet_mac_address")
        }
        return network_view(openstack.convert_net_json(copy.deepcopy(nd), known_macs=macs))
    net = util.load_yaml(text, default=None)
    if isinstance(net, dict) and isinstance(net.get("network"), dict):
        net = net["network"]
    if net is None:
        return {"error": "not YAML or JSON network data"}
    return network_view(net)


def asked_view(asked):
    out = {}
    if asked.get("userData") is not None:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                cfg, parts = processed(base64.b64decode(asked["userData"]), tmp)
                out["config"] = cfg
                out["parts"] = parts
            except Exception as e:  # noqa: BLE001
                out["configError"] = "%s: %s" % (type(e).__name__, e)
    if asked.get("networkData") is not None:
        out["network"] = network_from_text(base64.b64decode(asked["networkData"]))
    return out


def view(item):
    md, ud, public_keys, net = read_seed(item)
    with tempfile.TemporaryDirectory() as tmp:
        cfg, parts = processed(util.encode_text(ud) if isinstance(ud, str) else ud, tmp)
        distro = distros.fetch("debian")("debian", {}, helpers.Paths({"cloud_dir": tmp, "run_dir": tmp}))
        # A copy: normalization pops keys out of the config's user entries.
        users, _groups = ug_util.normalize_users_groups(copy.deepcopy(cfg), distro)
    # cc_set_hostname: fqdn, then hostname from the config, else the datasource's.
    hostname = cfg.get("fqdn") or cfg.get("hostname") or md.get("local-hostname") or md.get("hostname")
    keys = list(sources.normalize_pubkey_data(public_keys))
    keys += [k for k in cfg.get("ssh_authorized_keys", []) or []]
    files = {}
    for f in cfg.get("write_files", []) or []:
        content = cc_write_files.extract_contents(
            f.get("content", ""), cc_write_files.canonicalize_extraction(f.get("encoding"))
        )
        files[f["path"]] = base64.b64encode(util.encode_text(content)).decode()
    state = None if net is None else network_view(net)
    return {
        "ok": True,
        "hostname": hostname,
        "users": {name: {"sshKeys": list(u.get("ssh_authorized_keys", []) or [])} for name, u in users.items()},
        "sshKeys": keys,
        "files": files,
        "runcmd": [c if isinstance(c, str) else " ".join(c) for c in cfg.get("runcmd", []) or []],
        "network": state,
        "config": cfg,
        "parts": parts,
    }


def main():
    user_data.read_file_or_url = _no_fetch
    out = []
    for item in json.load(sys.stdin):
        try:
            v = dict(id=item["id"], **view(item))
        except Exception as e:  # noqa: BLE001
            v = {"id": item["id"], "ok": False, "error": "%s: %s" % (type(e).__name__, e)}
        if "asked" in item:
            v["asked"] = asked_view(item["asked"])
        out.append(v)
    # YAML may hold dates and other values JSON has no type for.
    json.dump(out, sys.stdout, default=str)


main()
