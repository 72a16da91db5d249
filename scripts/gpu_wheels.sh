#!/usr/bin/env bash
# Download the wheels scripts/gpu_check.sh may need (scripts/gpu_wheels.txt) for the GPU machine's
# Python 3.12 on manylinux x86-64, into DIR (default .whl, which git ignores): carry DIR to the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.whl}
mkdir -p "$DIR"
PY=${PYTHON:-python3}
grep -o '^[^# ]*' scripts/gpu_wheels.txt | grep . | while read -r req; do
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d "$DIR" "$req"
done
du -ch "$DIR"/*.whl | tail -1
