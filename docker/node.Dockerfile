# syntax=docker/dockerfile:1
# The TypeScript workers (control, browser) and the `halo` CLI: Node 20, Debian's Chromium and its headless shell
# (playwright-core drives the shell, as Playwright does for headless; there is no Playwright browser download), the npm packages from the lockfile, and a small Python
# venv at .venv with MiniWoB++ (its html/ task pages) and agisdk (REAL v2 tasks and their stdlib-only eval
# scripts), both without dependencies, where env/miniwob-server.ts and env/real-tasks.ts look for them.
# Build context: the repository root (docker-compose.yml); docker/node.Dockerfile.dockerignore applies.
FROM node:20-bookworm-slim

RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      chromium chromium-headless-shell fonts-liberation fonts-dejavu-core ca-certificates python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app

COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund --loglevel=error

# Same pins as launch.sh.
RUN python3 -m venv .venv \
 && .venv/bin/pip install --no-cache-dir --disable-pip-version-check --no-deps miniwob==1.1.0 agisdk==0.3.5

# The run curves the control worker writes (host/curves.ts → python -m halo_learner.curves): TensorBoard's writer
# and the optional wandb client, at the learner's pins.
COPY workers/learner/requirements.txt /tmp/learner-requirements.txt
RUN .venv/bin/pip install --no-cache-dir --disable-pip-version-check -c /tmp/learner-requirements.txt tensorboard wandb

COPY . .

ENV HALO_CHROMIUM=/usr/lib/chromium/chromium-headless-shell \
    HALO_HOME=/app/runs
RUN mkdir -p /app/runs /app/checkpoints && chown node:node /app/runs /app/checkpoints

# The image's unprivileged user (uid 1000): Chromium runs with its sandbox on only when it is not root.
USER node

# docker-compose.yml picks the worker; this default is the control worker.
CMD ["node", "--import", "tsx", "workers/control.ts"]
