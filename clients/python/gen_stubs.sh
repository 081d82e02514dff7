#!/usr/bin/env bash
# Generates the gRPC/protobuf Python modules of proto/tandem/** into
# tandem_client/_gen/ (not committed). Needs grpcio-tools in the Python that runs it
# (PYTHON, default python3).
#
#   clients/python/gen_stubs.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
proto="$(cd "$here/../../proto" && pwd)"
out="$here/tandem_client/_gen"
PY="${PYTHON:-python3}"

rm -rf "$out"
mkdir -p "$out"
"$PY" -m grpc_tools.protoc -I "$proto" \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  tandem/agent/v1/agent.proto tandem/step/v1/step.proto
# protoc writes `from tandem.agent.v1 import agent_pb2`; make the modules a subpackage of
# tandem_client instead of a top-level `tandem` package.
"$PY" - "$out" <<'PYEOF'
import pathlib, re, sys
out = pathlib.Path(sys.argv[1])
for d in [out, *[p for p in out.rglob("*") if p.is_dir()]]:
    (d / "__init__.py").touch()
for f in out.rglob("*_pb2*.py"):
    text = f.read_text()
    f.write_text(re.sub(r"^from tandem\.", "from tandem_client._gen.tandem.", text, flags=re.M))
PYEOF
echo "stubs written to $out" >&2
