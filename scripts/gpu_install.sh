#!/usr/bin/env bash
# On the offline GPU host, from the project root, once the parts of scripts/gpu_prepare.sh
# were copied to /tmp/w (docs/MODELS.md, "Taking the figures"); gpu_prepare.sh puts this
# file in .gpu/meta/install.sh. Puts the onnxruntime-gpu wheel back together and checks
# it, swaps the image's CPU onnxruntime for it (tidebatch refuses to run with two ONNX
# Runtime builds installed), installs the small wheels, and puts the text model back
# together from /tmp/w/text.* and checks it.
set -euo pipefail
W=/tmp/w
name=$(cat .gpu/meta/ort.name)
cat $W/part.* > "$W/$name"
[ "$(sha256sum "$W/$name" | awk '{print $1}')" = "$(cat .gpu/meta/ort.sha256)" ] || { echo "wheel checksum differs"; exit 3; }
python3 -m pip uninstall -y -q onnxruntime || true
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$W/$name" .gpu/whl/*.whl
python3 -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())"
text=models/text/minilm-fp32-v1.onnx
cat $W/text.* > "$text"
[ "$(sha256sum "$text" | awk '{print $1}')" = "$(cat .gpu/meta/text.sha256)" ] || { echo "text model checksum differs"; exit 3; }
echo "text model: $(du -b "$text" | cut -f1) bytes, checksum ok"
