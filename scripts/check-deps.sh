#!/usr/bin/env bash
# The workspace's dependency rule, checked on `cargo metadata` (scripts/test.sh runs it first):
#
#   fl-engine, fl-bench -> {fl-sampling, fl-blas, fl-kernels}; fl-sampling -> fl-kernels;
#   fl-blas -> fl-kernels; fl-kernels -> fl-kernels-sys; only fl-kernels depends on a -sys
#   crate; fl-kernels' `testing` is off by default and only dev-dependencies turn it on.
#
# Checked: every workspace crate is in the table below; its normal and build dependencies on
# workspace crates are the ones the table allows, its dev-dependencies those plus itself; no
# crate but fl-kernels names a `*-sys` crate, and only fl-kernels-sys is one (or sets `links`);
# fl-kernels' `default` feature leaves `testing` off; no normal or build dependency, and no
# feature of a crate, turns on `fl-kernels/testing`.
#
# Usage: scripts/check-deps.sh [METADATA.json]   (default: `cargo metadata --no-deps` here).
# Exit 0 with one "deps: ok" line, or 1 with one line per violation.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -ge 1 ]]; then
  meta="$1"
else
  meta="$(mktemp)"
  trap 'rm -f "$meta"' EXIT
  cargo metadata --format-version 1 --no-deps >"$meta"
fi
python3 - "$meta" <<'PY'
import json, sys

# Workspace crate -> the workspace crates it may depend on (normal and build dependencies).
ALLOWED = {
    "fl-kernels-sys": set(),
    "fl-kernels": {"fl-kernels-sys"},
    "fl-blas": {"fl-kernels"},
    "fl-sampling": {"fl-kernels"},
    "fl-engine": {"fl-kernels", "fl-blas", "fl-sampling"},
    "fl-bench": {"fl-kernels", "fl-blas", "fl-sampling"},
}
SYS = "fl-kernels-sys"       # the one -sys crate
SYS_USERS = {"fl-kernels"}   # the crates that may depend on it
TESTING = ("fl-kernels", "testing")

meta = json.load(open(sys.argv[1]))
members = {p["id"] for p in meta["packages"]} & set(meta.get("workspace_members", []))
pkgs = [p for p in meta["packages"] if p["id"] in members] or meta["packages"]
names = {p["name"] for p in pkgs}
bad = []

for p in sorted(pkgs, key=lambda p: p["name"]):
    name = p["name"]
    if name not in ALLOWED:
        bad.append(f"{name}: not in the dependency table of scripts/check-deps.sh (add it there and to README's graph)")
        continue
    if name.endswith("-sys") and name != SYS:
        bad.append(f"{name}: a second -sys crate ({SYS} is the only one)")
    if p.get("links") and name != SYS:
        bad.append(f"{name}: sets `links = \"{p['links']}\"` (only {SYS} links native code)")
    for d in p["dependencies"]:
        dep, kind = d["name"], d["kind"] or "normal"
        where = f"{name} -> {dep} ({kind} dependency)"
        if dep.endswith("-sys") and name not in SYS_USERS:
            bad.append(f"{where}: only {', '.join(sorted(SYS_USERS))} may depend on a -sys crate")
        if dep in names:
            allowed = ALLOWED[name] | ({name} if kind == "dev" else set())
            if dep not in allowed:
                bad.append(f"{where}: not in the graph ({name} -> {{{', '.join(sorted(ALLOWED[name])) or 'nothing'}}})")
        if dep == TESTING[0] and kind != "dev":
            if TESTING[1] in d.get("features", []):
                bad.append(f"{where}: turns on `{TESTING[1]}` (tests only: take it as a dev-dependency)")
    # `<dep>/testing` and `<dep>?/testing`, under the name the crate gives fl-kernels
    keys = {d["rename"] or d["name"] for d in p["dependencies"] if d["name"] == TESTING[0]}
    for feat, enables in p.get("features", {}).items():
        for e in enables:
            if name != TESTING[0] and e.replace("?", "") in {f"{k}/{TESTING[1]}" for k in keys}:
                bad.append(f"{name}: feature `{feat}` turns on `{e}` (tests only: take it as a dev-dependency)")
    if name == TESTING[0] and TESTING[1] in p.get("features", {}).get("default", []):
        bad.append(f"{name}: `default` turns on `{TESTING[1]}` (keep it opt-in)")

if bad:
    for b in bad:
        print(f"deps: FORBIDDEN {b}")
    sys.exit(1)
print(f"deps: ok ({len(pkgs)} crates follow the graph; only {', '.join(sorted(SYS_USERS))} -> {SYS}; "
      f"`{TESTING[1]}` only in dev-dependencies)")
PY
