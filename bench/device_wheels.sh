#!/bin/bash
# The wheels the device runs of bench/cost_per_gpu.sh need beside the device image's own packages (its Python
# 3.12 has grpcio and protobuf, but not necessarily the versions the kubelet stubs were generated with:
# exporter/kubelet/*_pb2*.py refuse protobuf < 7.35.1 or grpcio < 1.85.1 at import, which is how
# bench/scrape_8x64.py exited 1 there on 2026-11-26). Run here, where pip reaches the registry, from the
# repository root; .whl is ignored by git (.git/info/exclude) and carried by the device call:
#   bash bench/device_wheels.sh
set -eu
wheels=(
  nvitop==1.7.2 nvitop-exporter==1.7.2                            # the exporter compared against
  fastapi==0.165.0 fastapi-offline==1.7.7 starlette==1.10.0       # our JSON API
  pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2
  uvicorn==0.54.0 httptools==0.9.0 opentelemetry-api==1.45.2
  grpcio==1.85.3 protobuf==7.36.2                                 # the PodResources stubs (pyproject.toml)
)
mkdir -p .whl
exclude="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx '/.whl/' "$exclude" || echo '/.whl/' >> "$exclude"
for wheel in "${wheels[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$wheel"
done
ls .whl
