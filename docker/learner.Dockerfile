# syntax=docker/dockerfile:1
# The Python learner (workers/learner): Temporal worker on the `gpu` queue, torch + transformers + peft.
# PyTorch's CUDA build brings its own CUDA runtime libraries (the nvidia-* wheels), so a slim Python base with
# the CUDA wheel is a CUDA PyTorch image; the host needs only the NVIDIA driver and container toolkit.
# Python 3.11: the version requirements.txt was verified with.
# Build context: the repository root; docker/learner.Dockerfile.dockerignore keeps only workers/learner.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

# Where the CUDA torch wheel comes from. Empty: PyPI, whose Linux x86_64 torch wheels are CUDA builds.
# Set it to pick another CUDA version, e.g. --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
ARG TORCH_INDEX_URL=
ARG TORCH_VERSION=2.13.0
# Constrained updates compile the grammar vLLM sampled under, with vLLM 0.33's own pin (lib/model-io/grammar-blob.ts): a
# different xgrammar can draw other masks. --no-deps as launch.sh: its wheel lists triton, used only on CUDA kernels
# the learner never calls; its other dependency is in requirements.txt.
ARG XGRAMMAR_VERSION=0.2.8

ENV PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app/workers/learner \
    TOKENIZERS_PARALLELISM=false \
    HF_HOME=/hf-cache \
    HOME=/tmp \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY workers/learner/requirements.txt workers/learner/requirements.txt

# torch first and alone (as workers/learner/README.md says), then the pinned requirements (its torch pin is then satisfied).
RUN if [ -n "$TORCH_INDEX_URL" ]; then pip install "torch==${TORCH_VERSION}" --index-url "$TORCH_INDEX_URL"; \
    else pip install "torch==${TORCH_VERSION}"; fi \
 && python -c "import sys, torch; sys.exit(0 if torch.version.cuda else 'torch ' + torch.__version__ + ' is a CPU-only build: set TORCH_INDEX_URL to a CUDA wheel index')" \
 && pip install -r workers/learner/requirements.txt \
 && pip install --no-deps "xgrammar==${XGRAMMAR_VERSION}"

COPY workers/learner workers/learner
RUN mkdir -p /app/runs /app/checkpoints /hf-cache
# Compose runs this image as the stack's uid:gid, not root (docker-compose.yml): HOME=/tmp above gives torch's and
# Triton's caches a place that uid can write (a uid with no passwd entry gets HOME=/).

# SIGTERM drains the running activity (HALO_SHUTDOWN_GRACE_S) and exits.
CMD ["python", "-m", "halo_learner.worker"]
