"""Reads `cargo test --no-run --message-format=json` on stdin and prints "NAME PATH" for each test
executable the device check runs: every test of triage-ops (unit and integration) and
triage-engine's `cuda_device`. Shared by scripts/build-cuda (bundle) and scripts/device-check
(dry run), so both pick the same tests. With `--tools` it also prints "tool:NAME PATH" for the
`triage` binary and the `device_bench` and `write_fixture` examples that `cargo test` built too
(the dry run takes them from there: a `cargo build -p ...` of its own would unify features
differently and rebuild dependencies)."""
import json
import sys

TOOLS = {("bin", "triage"), ("example", "device_bench"), ("example", "write_fixture")}
tools = "--tools" in sys.argv[1:]

for line in sys.stdin:
    try:
        m = json.loads(line)
    except json.JSONDecodeError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    kind, name = m["target"]["kind"][0], m["target"]["name"]
    if tools and (kind, name) in TOOLS and not m.get("profile", {}).get("test"):
        print(f"tool:{name} {m['executable']}")
        continue
    if not m.get("profile", {}).get("test"):
        continue
    package = m["package_id"]
    name = m["target"]["name"]
    if "triage-ops" in package or name == "cuda_device":
        label = "unit" if m["target"]["kind"] == ["lib"] else name
        crate = "ops" if "triage-ops" in package else "engine"
        print(f"{crate}_{label} {m['executable']}")
