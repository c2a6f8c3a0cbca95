"""What cloud-init does with a seed's progress-reporting part, by its own code.

stdin: JSON {"seeds": [{"id", "dir", "datasource": "nocloud"|"configdrive"}],
             "report": {"id", "fail": bool, "singleProcess": bool}?}
stdout: JSON {"seeds": [{"id", "ok", "error"?, "userData", "cloudConfig",
              "vendorCloudConfig", "merged"}], "reported": bool}

Each seed directory is read by cloud-init's own datasource (DataSourceNoCloud
from its seed directory, DataSourceConfigDrive likewise), and stages.Init
consumes it as a first boot's init-network stage does (update, then
consume_data: user-data, then vendor-data, each through UserDataProcessor and
the part handlers), in a private cloud_dir. What the modules then see is
helpers.ConfigMerger over that instance, as config/modules.py builds it:
"merged". "userData" lists the parts of the processed user-data (type,
file name, base64 payload), "cloudConfig" is user-data's cloud-config
(cloud-config.txt), "vendorCloudConfig" vendor-data's and
"vendorSchemaErrors" what cloud-init's schema check says of it.

With "report": one stage is run as cloud-init runs modules-final (a
ReportEventStack named modules-final around config/modules.py's
Modules._run_modules with two modules, named as Debian 12's cloud.cfg names
them: final-message, which succeeds, and with "fail" scripts-user, which
raises as it does when a runcmd script exits non-zero),
the seed's merged configuration given to cmd/main.py's apply_reporting_cfg
where cloud-init does (see run_stage), and the events are flushed as
cmd/main.py does at the end of a stage. Whatever the reporting handlers post goes where the
seed says.
"""
import base64
import copy
import json
import logging
import os
import shutil
import sys
import tempfile
import types
import warnings

warnings.filterwarnings("ignore", category=DeprecationWarning)
logging.disable(logging.CRITICAL)

from cloudinit import helpers, reporting, stages, util  # noqa: E402
from cloudinit.cmd.main import apply_reporting_cfg  # noqa: E402
from cloudinit.config import modules as cc_modules  # noqa: E402
from cloudinit.config.schema import get_schema, validate_cloudconfig_schema  # noqa: E402
from cloudinit.reporting import events  # noqa: E402
from cloudinit.settings import PER_ALWAYS, PER_INSTANCE  # noqa: E402
from cloudinit.sources import DataSourceConfigDrive, DataSourceNoCloud  # noqa: E402


def base_cfg(tmp):
    # cloud-init's built-in defaults (settings.CFG_BUILTIN: vendor_data
    # enabled, ...) under this harness's paths.
    return util.mergemanydict(
        [
            {
                "system_info": {
                    "distro": "debian",
                    "paths": {"cloud_dir": os.path.join(tmp, "cloud"), "run_dir": os.path.join(tmp, "run")},
                },
                # No block devices: the seed directory only.
                "datasource": {"NoCloud": {"fs_label": None}},
            },
            util.get_builtin_cfg(),
        ]
    )


class _Init(stages.Init):
    # The system configuration is this harness's, not the host's /etc/cloud.
    def __init__(self, cfg):
        self._harness_cfg = cfg
        super().__init__(ds_deps=[])

    def _read_cfg(self, extra_fns):
        return copy.deepcopy(self._harness_cfg)


def datasource_for(item, init):
    paths = init.paths
    if item["datasource"] == "nocloud":
        shutil.copytree(item["dir"], os.path.join(paths.seed_dir, "nocloud"))
        ds = DataSourceNoCloud.DataSourceNoCloud(init.cfg, init.distro, paths)
    else:
        shutil.copytree(item["dir"], os.path.join(paths.seed_dir, "config_drive"))
        ds = DataSourceConfigDrive.DataSourceConfigDrive(init.cfg, init.distro, paths)
    if not ds.get_data():
        raise RuntimeError("the datasource found no seed in %s" % item["dir"])
    return ds


def read_yaml(path):
    if not os.path.isfile(path):
        return None
    # 25.1 renamed load_file.
    load = getattr(util, "load_text_file", None) or util.load_file
    return util.load_yaml(load(path), default={})


def parts(msg):
    # The processed message's parts (its boundary is random): type, file
    # name and payload of each.
    out = []
    for part in msg.walk():
        if part.get_content_maintype() == "multipart":
            continue
        payload = part.get_payload(decode=True) or b""
        out.append([part.get_content_type(), part.get_filename(), base64.b64encode(payload).decode()])
    return out


def schema_errors(cfg):
    # What cloud-init's schema check says of a cloud-config (None: valid).
    if cfg is None:
        return None
    try:
        validate_cloudconfig_schema(cfg, get_schema(), strict=True)
    except Exception as e:  # noqa: BLE001
        return str(e)
    return None


def consume(item, tmp):
    cfg = base_cfg(tmp)
    init = _Init(cfg)
    init.initialize()
    init.datasource = datasource_for(item, init)
    init._reset()
    init.instancify()
    init.update()
    init.consume_data(PER_INSTANCE)
    paths = init.paths
    merged = helpers.ConfigMerger(paths=paths, datasource=init.datasource, base_cfg=cfg).cfg
    vendor = read_yaml(paths.get_ipath_cur("vendor_cloud_config"))
    return init, {
        "userData": parts(init.datasource.get_userdata()),
        "vendorSchemaErrors": schema_errors(vendor),
        "cloudConfig": read_yaml(paths.get_ipath_cur("cloud_config")),
        "vendorCloudConfig": read_yaml(paths.get_ipath_cur("vendor_cloud_config")),
        "merged": merged,
    }


def _module(name, fail):
    # 22.4 passes (name, cfg, cloud, log, args); 25.1 keywords by signature.
    def handle(*_args, **_kwargs):
        if fail:
            raise RuntimeError("Runparts: 1 failures (runcmd) in 1 attempted commands")

    m = types.ModuleType("cc_" + name)
    m.handle = handle
    return cc_modules.ModuleDetails(module=m, name=name, frequency=PER_ALWAYS, run_args=[])


def run_stage(init, merged, fail, single_process):
    # One process per stage (22.4; 25.1 without --all-stages): the stage's
    # start event is published (cmd/main.py main) before main_modules applies
    # the reporting configuration. One process for all stages (25.1's
    # cloud-init-main.service, `cloud-init --all-stages`): init-network has
    # applied it already.
    if single_process:
        apply_reporting_cfg(merged)
    stage = events.ReportEventStack("modules-final", "running modules for final", reporting_enabled=True)
    with stage:
        if not single_process:
            apply_reporting_cfg(merged)
        mods = cc_modules.Modules(init, [], reporter=stage)
        mods._run_modules([_module("final-message", False)] + ([_module("scripts-user", True)] if fail else []))
    reporting.flush_events()


def main():
    req = json.load(sys.stdin)
    out = {"seeds": [], "reported": False}
    report = req.get("report")
    for item in req["seeds"]:
        tmp = tempfile.mkdtemp(prefix="vmseed-progress-")
        try:
            init, view = consume(item, tmp)
            out["seeds"].append(dict(id=item["id"], ok=True, **view))
            if report and report["id"] == item["id"]:
                run_stage(init, view["merged"], report.get("fail", False), report.get("singleProcess", False))
                out["reported"] = True
        except Exception as e:  # noqa: BLE001
            out["seeds"].append({"id": item["id"], "ok": False, "error": "%s: %s" % (type(e).__name__, e)})
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    json.dump(out, sys.stdout, default=str)


main()
