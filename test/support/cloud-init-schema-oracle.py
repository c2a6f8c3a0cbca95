"""The schema oracle's driver: a cloud-init release's own schema validation.

Run by test/support/cloud-init-schema-oracle.ts with /usr/bin/python3 (Debian's,
with its jsonschema) and, for a release other than the installed one, that
release's extracted cloudinit package first on PYTHONPATH.

argv[1]: the release expected on the path ("22.4", "25.1"): a mismatch exits 3.
stdin:   a JSON list of {"path": "...", "type": "cloud-config" | "network-config"}.
stdout:  one JSON object, path -> {"errors": [{"path", "message"}],
         "deprecations": [...], "exception"?: "Type: message",
         "unsupported"?: true, "skipped"?: "what cloud-init printed"}.

Each file goes through cloudinit.config.schema.validate_cloudconfig_file, the
function `cloud-init schema --config-file` calls, with the schema the CLI
passes. That function reports deprecations by printing them (22.4 and 25.1
alike) and raises SchemaValidationError only for errors; 25.1 even re-raises
a new SchemaValidationError carrying the errors alone. So the driver also
wraps the module's validate_cloudconfig_schema (which validate_cloudconfig_file
looks up at call time) to keep the exception it raises in strict mode, whose
schema_deprecations are the structured form of what the CLI prints.
"""

import contextlib
import io
import json
import logging
import sys
import warnings


def main() -> int:
    expected = sys.argv[1]
    warnings.simplefilter("ignore")
    # Nothing of cloud-init's logging may reach stdout/stderr.
    logging.disable(logging.CRITICAL)
    logging.getLogger().addHandler(logging.NullHandler())

    from cloudinit import version
    from cloudinit.config import schema as cs

    found = version.version_string()
    if not (found == expected or found.startswith(expected + ".")):
        print(
            f"cloud-init {found} on the path, expected {expected}: {cs.__file__}",
            file=sys.stderr,
        )
        return 3

    has_types = hasattr(cs, "SchemaType")  # 23.x on; 22.4 has cloud-config only
    if has_types:
        # Network v2 goes to netplan's parser when its Python API is present,
        # and is skipped when only the netplan binary is: neither is cloud-init's
        # JSON schema, so both are turned off (a host without netplan does the same).
        import cloudinit.net.netplan as netplan

        cs.LIBNETPLAN_AVAILABLE = False
        netplan.available = lambda target=None: False

    captured = []
    original = cs.validate_cloudconfig_schema

    def validate_cloudconfig_schema(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        except cs.SchemaValidationError as e:
            captured.append(e)
            raise

    cs.validate_cloudconfig_schema = validate_cloudconfig_schema

    cloud_schema = cs.get_schema()
    network_schema = cs.get_schema(cs.SchemaType.NETWORK_CONFIG) if has_types else None

    def problems(items):
        out = []
        for p in items or []:
            # SchemaProblem is a NamedTuple(path, message); plain tuples too.
            entry = {"path": str(p[0]), "message": str(p[1])}
            if entry not in out:
                out.append(entry)
        return out

    files = json.load(sys.stdin)
    results = {}
    for f in files:
        path, kind = f["path"], f["type"]
        result = {"errors": [], "deprecations": []}
        results[path] = result
        if kind == "network-config" and not has_types:
            result["unsupported"] = True
            continue
        if kind not in ("cloud-config", "network-config"):
            result["exception"] = f"ValueError: unknown type {kind!r}"
            continue
        captured.clear()
        printed = io.StringIO()
        raised = None
        returned = None
        try:
            with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
                if has_types:
                    network = kind == "network-config"
                    returned = cs.validate_cloudconfig_file(
                        path,
                        network_schema if network else cloud_schema,
                        schema_type=(
                            cs.SchemaType.NETWORK_CONFIG if network else cs.SchemaType.CLOUD_CONFIG
                        ),
                        annotate=False,
                        instance_data_path=None,
                    )
                else:
                    returned = cs.validate_cloudconfig_file(path, cloud_schema, annotate=False)
        except cs.SchemaValidationError as e:
            raised = e
        except (Exception, SystemExit) as e:  # cloud-init's error() exits
            result["exception"] = f"{type(e).__name__}: {e}"
        if raised is not None:
            result["errors"] = problems(raised.schema_errors)
        deprecations = []
        for e in captured + ([raised] if raised is not None else []):
            deprecations += e.schema_deprecations or []
        result["deprecations"] = problems(deprecations)
        # 25.1 returns False when it validated nothing (empty file, a
        # non-cloud-config user-data type, empty network config).
        if returned is False and raised is None and "exception" not in result:
            result["skipped"] = printed.getvalue().strip() or "not validated"
    json.dump(results, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
