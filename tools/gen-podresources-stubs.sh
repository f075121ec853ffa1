#!/usr/bin/env bash
# Regenerates exporter/kubelet/podresources_pb2{,_grpc}.py from podresources.proto (pip install grpcio-tools).
# The stubs are committed so that the exporter needs only grpcio and protobuf at run time.
set -euo pipefail
cd "$(dirname "$0")/../exporter/kubelet"
python3 -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. podresources.proto
# protoc writes `import podresources_pb2`: make it a package-relative import.
sed -i 's/^import podresources_pb2 as/from exporter.kubelet import podresources_pb2 as/' podresources_pb2_grpc.py
