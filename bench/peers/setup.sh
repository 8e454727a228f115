#!/usr/bin/env bash
# Makes .venv-peers (git-ignored): the environment of the quixstreams and Bytewax
# peers of bench/peers.py. tidebatch itself is not installed in it: quixstreams pins
# confluent-kafka < 2.13 and tidebatch needs >= 2.16 (pyproject.toml). The peers
# import only tidebatch's CTR codec (pipeline/codecs/ctr.py: numpy, orjson and msgspec) and
# models/ctr/features.py, through PYTHONPATH set by bench/peers.py.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${PYTHON:-python3.11}"
"$python" -m venv "$repo/.venv-peers"
"$repo/.venv-peers/bin/pip" install --quiet --upgrade pip
"$repo/.venv-peers/bin/pip" install --quiet -r "$here/requirements.txt"
"$repo/.venv-peers/bin/python" -c "import quixstreams, bytewax, onnxruntime; print('quixstreams', quixstreams.__version__, 'onnxruntime', onnxruntime.__version__)"
