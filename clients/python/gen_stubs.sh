#!/usr/bin/env bash
# Generates the gRPC/protobuf Python modules of proto/tandem/** as the package
# tandem_client._gen. Needs grpcio-tools in the Python that runs it (PYTHON, default python3).
#
#   clients/python/gen_stubs.sh [--out DIR]
#
# By default it writes clients/python/tandem_client/_gen inside this checkout (git-ignored):
# the client imports the stubs from there (`pip install -e clients/python` uses the checkout).
# --out DIR writes them elsewhere instead, e.g. into a copy of the package
# (`cp -r clients/python /tmp/client && gen_stubs.sh --out /tmp/client/tandem_client/_gen`) when
# the checkout is read-only or must stay clean. DIR is replaced; an existing DIR that holds
# anything but earlier stubs is refused.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
proto="$(cd "$here/../../proto" && pwd)"
out="$here/tandem_client/_gen"
PY="${PYTHON:-python3}"

while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) [[ $# -ge 2 ]] || { echo "gen_stubs.sh: --out needs a folder" >&2; exit 2; }; out="$2"; shift 2 ;;
    --out=*) out="${1#--out=}"; shift ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gen_stubs.sh: unknown argument '$1' (usage: gen_stubs.sh [--out DIR])" >&2; exit 2 ;;
  esac
done
[[ -n "$out" ]] || { echo "gen_stubs.sh: --out needs a folder" >&2; exit 2; }
if [[ -d "$out" && -n "$(ls -A "$out")" && ! -f "$out/tandem/agent/v1/agent_pb2.py" ]]; then
  echo "gen_stubs.sh: $out is not empty and holds no earlier stubs; not replacing it (choose an empty or new folder)" >&2
  exit 1
fi
if [[ -e "$out" && ! -d "$out" ]]; then
  echo "gen_stubs.sh: $out is not a folder" >&2
  exit 1
fi

if ! "$PY" -c 'import grpc_tools.protoc' 2>/dev/null; then
  echo "gen_stubs.sh: $PY has no grpcio-tools (pip install grpcio-tools, or set PYTHON to a Python that has it); $out left as it was" >&2
  exit 1
fi
# Generate beside $out and swap it in only when everything succeeded: a failure leaves $out as it was.
mkdir -p "$(dirname "$out")"
tmp="$(mktemp -d "$(dirname "$out")/.gen_stubs.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
"$PY" -m grpc_tools.protoc -I "$proto" \
  --python_out="$tmp" --pyi_out="$tmp" --grpc_python_out="$tmp" \
  tandem/agent/v1/agent.proto tandem/step/v1/step.proto
# protoc writes `from tandem.agent.v1 import agent_pb2`; make the modules a subpackage of
# tandem_client instead of a top-level `tandem` package.
"$PY" - "$tmp" <<'PYEOF'
import pathlib, re, sys
out = pathlib.Path(sys.argv[1])
for d in [out, *[p for p in out.rglob("*") if p.is_dir()]]:
    (d / "__init__.py").touch()
for f in out.rglob("*_pb2*.py"):
    text = f.read_text()
    f.write_text(re.sub(r"^from tandem\.", "from tandem_client._gen.tandem.", text, flags=re.M))
PYEOF
rm -rf "$out"
mv "$tmp" "$out"
echo "gen_stubs.sh: stubs written to $out (import them as tandem_client._gen)" >&2
