"""cloud-init's own parsers as test oracles, batched: one process per test file.

stdin: JSON {"cloudConfigs": [{"id", "text"}], "mimes": [{"id", "text"}], "networkConfigs": [{"id", "text"}],
             "noCloudDirs": [{"id", "dir"}], "configDrives": [{"id", "dir"}]}
stdout: JSON with one result per item, {"id", "ok", "error"?, ...}.
"""
import base64
import copy
import json
import logging
import sys

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
        }
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
    }
    json.dump(out, sys.stdout)


main()
