"""cloud-init's own parsers as test oracles, batched: one process per test file.

stdin: JSON {"cloudConfigs": [{"id", "text"}], "mimes": [{"id", "text"}], "networkConfigs": [{"id", "text"}],
             "noCloudDirs": [{"id", "dir"}], "configDrives": [{"id", "dir"}]}
             "networkRenders": [{"id", "format": "yaml"|"network_data", "text"}],
             "passwords": [{"id", "password", "hash"}]}
stdout: JSON with one result per item, {"id", "ok", "error"?, ...}.
"""
import base64
import copy
import json
import logging
import sys
import warnings

warnings.filterwarnings("ignore", category=DeprecationWarning)

logging.disable(logging.CRITICAL)

from cloudinit import sources, util  # noqa: E402
from cloudinit.config.schema import (  # noqa: E402
    SchemaValidationError,
    get_schema,
    validate_cloudconfig_schema,
)
from cloudinit.net import network_state  # noqa: E402
from cloudinit.sources.helpers import openstack  # noqa: E402
from cloudinit.sources.helpers.openstack import ConfigDriveReader  # noqa: E402


def err(e):
    return "%s: %s" % (type(e).__name__, e)


def cloud_config(item, schema):
    try:
        cfg = util.load_yaml(item["text"], default=None)
        if cfg is None and item["text"].strip() not in ("", "#cloud-config"):
            return {"ok": False, "error": "load_yaml returned nothing"}
        validate_cloudconfig_schema(cfg or {}, schema, strict=True, log_details=False)
        return {"ok": True}
    except SchemaValidationError as e:
        return {"ok": False, "error": err(e)}
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "error": err(e)}


def mime_cloud_configs(item, schema):
    # The text/cloud-config parts of a MIME multipart user-data, each validated.
    import email

    msg = email.message_from_string(item["text"])
    parts = [p for p in msg.walk() if p.get_content_type() == "text/cloud-config"]
    if not parts:
        return {"ok": False, "error": "no text/cloud-config part"}
    for p in parts:
        r = cloud_config({"text": p.get_payload(decode=True).decode()}, schema)
        if not r["ok"]:
            return r
    return {"ok": True, "count": len(parts)}


def network_config(item):
    try:
        cfg = util.load_yaml(item["text"], default=None)
        if not isinstance(cfg, dict):
            return {"ok": False, "error": "not a mapping"}
        if "network" in cfg and isinstance(cfg["network"], dict):
            cfg = cfg["network"]
        state = network_state.parse_net_config_data(cfg, skip_broken=False)
        if state is None:
            return {"ok": False, "error": "parse_net_config_data returned None"}
        return {
            "ok": True,
            "version": cfg.get("version"),
            "interfaces": sorted(i["name"] for i in state.iter_interfaces()),
        }
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "error": err(e)}


def nocloud_dir(item):
    # What DataSourceNoCloud does with a mounted cidata filesystem.
    try:
        seeded = util.pathprefix2dict(
            item["dir"], required=["user-data", "meta-data"], optional=["vendor-data", "network-config"]
        )
        md = util.load_yaml(seeded["meta-data"], default={})
        return {
            "ok": True,
            "instanceId": md.get("instance-id"),
            "hostname": md.get("local-hostname"),
            "publicKeys": md.get("public-keys"),
            # What DataSource.get_public_ssh_keys hands to cc_ssh.
            "sshKeys": sources.normalize_pubkey_data(md.get("public-keys")),
            "userdata": base64.b64encode(util.encode_text(seeded["user-data"])).decode(),
            "hasNetworkConfig": "network-config" in seeded,
            "vendordata": util.decode_binary(seeded["vendor-data"]) if "vendor-data" in seeded else None,
        }
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "error": err(e)}


def config_drive(item):
    try:
        res = ConfigDriveReader(item["dir"]).read_v2()
        md = res["metadata"]
        ud = res.get("userdata")
        if isinstance(ud, str):
            ud = ud.encode()
        nd = res.get("networkdata")
        net = None
        if nd is not None:
            # What DataSourceConfigDrive.network_config does with network_data.json.
            # There is no guest here to name NICs, so stand in for its MAC table.
            macs = {
                lk["ethernet_mac_address"].lower(): "eth%d" % i
                for i, lk in enumerate(nd.get("links", []))
                if lk.get("ethernet_mac_address")
            }
            # convert_net_json edits its argument in place.
            converted = openstack.convert_net_json(copy.deepcopy(nd), known_macs=macs)
            state = network_state.parse_net_config_data(converted, skip_broken=False)
            net = sorted(i["name"] for i in state.iter_interfaces())
        return {
            "ok": True,
            "instanceId": md.get("instance-id"),
            "hostname": md.get("local-hostname"),
            "publicKeys": md.get("public_keys"),
            # ConfigDrive v2's get_public_ssh_keys reads "public_keys".
            "sshKeys": sources.normalize_pubkey_data(md.get("public_keys")),
            "userdata": base64.b64encode(ud or b"").decode(),
            "networkdata": nd,
            "interfaces": net,
            # What DataSourceConfigDrive hands to cloud-init as vendor-data.
            "vendordata": sources.convert_vendordata(res.get("vendordata")),
        }
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "error": err(e)}


def _state_summary(state):
    # What the guest ends up with, independent of how the config was spelled.
    ifaces = []
    for i in state.iter_interfaces():
        subnets = []
        for sn in i.get("subnets", []):
            subnets.append({
                "type": sn.get("type"),
                "address": sn.get("address"),
                "prefix": sn.get("prefix"),
                "gateway": sn.get("gateway"),
                "dns_nameservers": sn.get("dns_nameservers", []),
                "dns_search": sn.get("dns_search", []),
                "routes": [
                    {"network": r.get("network"), "prefix": r.get("prefix"), "gateway": r.get("gateway")}
                    for r in sn.get("routes", [])
                ],
            })
        ifaces.append({
            "name": i.get("name"),
            "mac": (i.get("mac_address") or "").lower() or None,
            "mtu": i.get("mtu"),
            "type": i.get("type"),
            "accept-ra": i.get("accept-ra"),
            "subnets": subnets,
        })
    return {
        "interfaces": ifaces,
        "dns": {"nameservers": list(state.dns_nameservers), "search": list(state.dns_searchdomains)},
    }


def network_render(item):
    """Parse like cloud-init does, then render with its eni and netplan renderers."""
    import os
    import tempfile

    from cloudinit.net import eni, netplan

    try:
        if item["format"] == "network_data":
            nd = json.loads(item["text"])
            macs = {
                # Stand-in kernel names for the guest NICs (no guest here).
                lk["ethernet_mac_address"].lower(): lk.get("name") or "kernelnic%d" % i
                for i, lk in enumerate(nd.get("links", []))
                if lk.get("ethernet_mac_address")
            }
            cfg = openstack.convert_net_json(copy.deepcopy(nd), known_macs=macs)
        else:
            cfg = util.load_yaml(item["text"], default=None)
            if "network" in cfg and isinstance(cfg["network"], dict):
                cfg = cfg["network"]
        state = network_state.parse_net_config_data(cfg, skip_broken=False)
        out = {"ok": True, "state": _state_summary(state)}
        with tempfile.TemporaryDirectory() as tmp:
            eni.Renderer({"eni_path": "etc/network/interfaces", "links_path_prefix": None}).render_network_state(
                state, target=tmp
            )
            with open(os.path.join(tmp, "etc/network/interfaces")) as f:
                out["eni"] = f.read()
            netplan.Renderer({"netplan_path": "etc/netplan/50-cloud-init.yaml", "postcmds": False}).render_network_state(
                state, target=tmp
            )
            with open(os.path.join(tmp, "etc/netplan/50-cloud-init.yaml")) as f:
                out["netplan"] = f.read()
        return out
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "error": err(e)}


def password(item):
    import crypt

    try:
        return {"ok": crypt.crypt(item["password"], item["hash"]) == item["hash"]}
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "error": err(e)}


def main():
    req = json.load(sys.stdin)
    schema = get_schema()
    out = {
        "cloudConfigs": [dict(id=i["id"], **cloud_config(i, schema)) for i in req.get("cloudConfigs", [])],
        "mimes": [dict(id=i["id"], **mime_cloud_configs(i, schema)) for i in req.get("mimes", [])],
        "networkConfigs": [dict(id=i["id"], **network_config(i)) for i in req.get("networkConfigs", [])],
        "noCloudDirs": [dict(id=i["id"], **nocloud_dir(i)) for i in req.get("noCloudDirs", [])],
        "configDrives": [dict(id=i["id"], **config_drive(i)) for i in req.get("configDrives", [])],
        "networkRenders": [dict(id=i["id"], **network_render(i)) for i in req.get("networkRenders", [])],
        "passwords": [dict(id=i["id"], **password(i)) for i in req.get("passwords", [])],
    }
    json.dump(out, sys.stdout)


main()
