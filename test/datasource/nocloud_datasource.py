# Runs cloud-init's own NoCloud datasource (DataSourceNoCloud /
# DataSourceNoCloudNet._get_data) against a DMI serial, the way a guest with
# no seed disk runs it, and prints what it found as JSON.
#
# argv: <cloud-init tree or ""> <serial> <NoCloud|NoCloudNet> <retries|default>
#   tree "": the installed package (Debian 12: 22.4); otherwise a directory
#   holding another release's `cloudinit` package.
# Only the machine is faked: the DMI serial, an empty kernel command line
# (not the host's), and no block devices; the URL handling is cloud-init's.
import base64, json, sys, tempfile, time

root, serial, dsname, retries = sys.argv[1:5]
if root:
    sys.path.insert(0, root)

from cloudinit import dmi, helpers, url_helper, util  # noqa: E402
from cloudinit.sources import DataSourceNoCloud as nocloud  # noqa: E402

dmi.read_dmi_data = lambda key: serial if key == "system-serial-number" else None
util.get_cmdline = lambda: "root=/dev/vda ro"
nocloud.DataSourceNoCloud._get_devices = lambda self, label: []

requests = []
_read = url_helper.read_file_or_url


def recording_read(url, **kwargs):
    try:
        resp = _read(url, **kwargs)
    except url_helper.UrlError as e:
        requests.append({"url": url, "code": e.code})
        raise
    requests.append({"url": url, "code": resp.code})
    return resp


url_helper.read_file_or_url = recording_read
if retries != "default":
    _seeded = util.read_seeded

    def read_seeded(base="", ext="", timeout=5, retries_=None, **kw):
        return _seeded(base, ext, timeout=timeout, retries=int(retries))

    util.read_seeded = read_seeded

b64 = lambda x: None if x is None else base64.b64encode(x if isinstance(x, bytes) else x.encode()).decode()
with tempfile.TemporaryDirectory() as tmp:
    paths = helpers.Paths({"cloud_dir": tmp, "run_dir": tmp})
    cls = nocloud.DataSourceNoCloudNet if dsname == "NoCloudNet" else nocloud.DataSourceNoCloud
    ds = cls(sys_cfg={}, distro=None, paths=paths)
    out = {"requests": requests}
    t0 = time.monotonic()
    try:
        out["claimed"] = bool(ds._get_data())
    except Exception as e:
        out["claimed"] = False
        out["error"] = type(e).__name__ + ": " + str(e)
    out["seconds"] = time.monotonic() - t0
    if out["claimed"]:
        out["dsmode"] = ds.dsmode
        md = dict(ds.metadata)
        md.pop("dsmode", None)
        out["metadata"] = md
        out["userdata"] = b64(ds.userdata_raw)
        out["vendordata"] = b64(ds.vendordata_raw)
        out["network_config"] = ds._network_config
    if hasattr(ds, "ds_detect"):
        out["ds_detect"] = bool(ds.ds_detect())
    print(json.dumps(out, default=str))
