#!/usr/bin/env bash
# Regenerate example_pb2.py from example.proto.
#
# Uses protoc 25.1 (bundled in grpcio-tools 1.62.3): its gencode carries no
# ValidateProtobufRuntimeVersion call, so the committed module imports without warnings
# on protobuf 4.25, 5.x and 6.x runtimes (gencode from protoc >= 26 checks the runtime's
# major version). Runs in a throwaway venv so the project's own environment is untouched.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
VENV="${GEN_VENV:-/tmp/tfrbeam-protoc-venv}"

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet "grpcio-tools==1.62.3"
fi
"$VENV/bin/python" -m grpc_tools.protoc --version | grep -qx "libprotoc 25.1"

# Compile from the repository root so the descriptor's file name is the unique
# "tfrbeam/codec/protos/example.proto" (a bare "example.proto" could clash in the default pool).
cd "$REPO"
"$VENV/bin/python" -m grpc_tools.protoc --proto_path=. --python_out=. tfrbeam/codec/protos/example.proto
echo "wrote $HERE/example_pb2.py"
