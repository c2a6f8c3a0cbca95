# Reads an extracted seed with cloud-init's own code (Debian's cloud-init
# package) and prints what it found as JSON, bytes as base64.
import base64
import json
import sys

from cloudinit import util
from cloudinit.sources.helpers import openstack


def b64(v):
    if v is None:
        return None
    if isinstance(v, str):
        v = v.encode()
    return base64.b64encode(v).decode()


mode, path = sys.argv[1], sys.argv[2]
if mode == "nocloud":
    # What DataSourceNoCloud does with a mounted seed device.
    found = util.pathprefix2dict(
        path,
        required=["user-data", "meta-data"],
        optional=["vendor-data", "network-config"],
    )
    md, ud, vd = util.read_seeded("file://" + path.rstrip("/") + "/", timeout=1, retries=0)
    print(json.dumps({
        "files": {k: b64(v) for k, v in found.items()},
        "seeded": {"meta-data": md, "user-data": b64(ud), "vendor-data": b64(vd)},
        "meta-data-yaml": util.load_yaml(found["meta-data"]),
    }))
else:
    r = openstack.ConfigDriveReader(path).read_v2()
    print(json.dumps({
        "metadata": r["metadata"],
        "userdata": b64(r.get("userdata")),
        "vendordata": r.get("vendordata"),
        "networkdata": r.get("networkdata"),
        "version": r["version"],
    }, default=str))
