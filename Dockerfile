# syntax=docker/dockerfile:1
#
# One image for every antdt service; the service is the subcommand:
#   docker run antdt:0.1.0 sharder       (health and metrics on 9402)
#   docker run antdt:0.1.0 monitor       (9403)
#   docker run antdt:0.1.0 controller    (9404)
#   docker run antdt:0.1.0 worker        (the example training worker)
#   docker run antdt:0.1.0 topics --create
# Health checks run `antdt probe --port N --path /readyz` (no curl in a slim image).
#
# torch comes from the CPU wheel index by default. For a CUDA image, point the
# build at a CUDA wheel index, e.g.
#   docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 -t antdt:0.1.0-cu128 .

ARG PYTHON_IMAGE=python:3.11-slim-trixie

# ---------------------------------------------------------------- build stage
# Installs into a virtual environment that the runtime stage copies whole, so
# pip, wheels and the source tree never reach the final image.
FROM ${PYTHON_IMAGE} AS build

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# Keep in step with the Makefile's pin.
ARG TORCH_VERSION=2.13.0

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

RUN python -m venv /opt/antdt
ENV PATH=/opt/antdt/bin:$PATH

# torch first, from its own index, in a layer of its own: the largest and the
# slowest-changing dependency, so a source change does not download it again.
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"

WORKDIR /src
COPY pyproject.toml README.md ./
COPY antdt ./antdt
COPY services ./services
COPY worker ./worker
COPY schemas ./schemas
# torch is already satisfied, so this takes only antdt's other dependencies from PyPI.
RUN pip install . && antdt --version

# -------------------------------------------------------------- runtime stage
FROM ${PYTHON_IMAGE}

LABEL org.opencontainers.image.title="antdt" \
      org.opencontainers.image.description="Straggler and leader mitigation for distributed training, on Kafka" \
      org.opencontainers.image.licenses="Apache-2.0"

# A fixed numeric uid, so Kubernetes' runAsNonRoot can verify it. The home
# holds what must outlive a container: a parameter server's checkpoints and
# ledger, a local worker's checkpoints (mount a volume on /var/lib/antdt).
RUN groupadd --system --gid 10001 antdt \
 && useradd --system --uid 10001 --gid antdt --home-dir /var/lib/antdt --create-home --shell /usr/sbin/nologin antdt \
 && install -d -o antdt -g antdt /var/lib/antdt/checkpoints /var/lib/antdt/ps /var/lib/antdt/ledger

COPY --from=build /opt/antdt /opt/antdt
ENV PATH=/opt/antdt/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /var/lib/antdt
USER 10001:10001

# Health and metrics (/healthz, /readyz, /metrics): sharder, monitor, controller, grouper.
EXPOSE 9402 9403 9404 9406

# No HEALTHCHECK here: the port depends on the service, so Compose and
# Kubernetes define theirs (antdt probe --port N --path /readyz).
ENTRYPOINT ["antdt"]
CMD ["--help"]
