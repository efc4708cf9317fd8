#!/usr/bin/env bash
# Regenerates the message and stub modules of src/tollgate_agent/_proto from
# the agent's proto (proto/tollgate/agent/v1/agent.proto and the
# proto/tollgate/v1/key_limits.proto it imports), with grpcio-tools.
#
#   clients/python/generate.sh [OUT_DIR]
#
# OUT_DIR defaults to src/tollgate_agent/_proto; tests/test_generated.py
# generates into a temporary directory and compares, so the committed modules
# can never drift from the proto. PYTHON names the interpreter that has the
# pinned grpcio-tools of the package's `test` extra (default: python3).
#
# protoc writes imports from the proto root (`from tollgate.v1 import ...`);
# the modules live inside the package, so those imports are rewritten to
# `from tollgate_agent._proto.tollgate.v1 import ...`. The descriptors keep
# their canonical file names (tollgate/v1/key_limits.proto), the ones the
# agent's reflection service announces.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
proto_root="$(cd "$here/../../proto" && pwd)"
out="${1:-$here/src/tollgate_agent/_proto}"
python="${PYTHON:-python3}"

mkdir -p "$out"
out="$(cd "$out" && pwd)"
rm -rf "$out/tollgate"

"$python" -m grpc_tools.protoc \
  --proto_path="$proto_root" \
  --python_out="$out" \
  --pyi_out="$out" \
  --grpc_python_out="$out" \
  tollgate/agent/v1/agent.proto \
  tollgate/v1/key_limits.proto

# Only the agent's service is used: drop the KeyLimits stubs protoc wrote
# beside the messages CheckKeys borrows.
rm -f "$out/tollgate/v1/key_limits_pb2_grpc.py"

find "$out/tollgate" -name '*.py' -o -name '*.pyi' | sort | while read -r file; do
  sed -i -E 's/^from tollgate\.(agent\.v1|v1) import /from tollgate_agent._proto.tollgate.\1 import /' "$file"
done

for dir in "$out/tollgate" "$out/tollgate/agent" "$out/tollgate/agent/v1" "$out/tollgate/v1"; do
  : > "$dir/__init__.py"
done
if [ ! -f "$out/__init__.py" ]; then
  printf '"""Modules generated from proto/tollgate by generate.sh: do not edit."""\n' > "$out/__init__.py"
fi
