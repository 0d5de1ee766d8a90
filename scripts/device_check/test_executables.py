"""Reads `cargo test --no-run --message-format=json` on stdin and prints "NAME PATH" for each test
executable the device check runs: every test of triage-ops (unit and integration) and
triage-engine's `cuda_device`. Shared by scripts/build-cuda (bundle) and scripts/device-check
(dry run), so both pick the same tests."""
import json
import sys

for line in sys.stdin:
    try:
        m = json.loads(line)
    except json.JSONDecodeError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    if not m.get("profile", {}).get("test"):
        continue
    package = m["package_id"]
    name = m["target"]["name"]
    if "triage-ops" in package or name == "cuda_device":
        label = "unit" if m["target"]["kind"] == ["lib"] else name
        crate = "ops" if "triage-ops" in package else "engine"
        print(f"{crate}_{label} {m['executable']}")
