# Image for the botmemory API and worker (same image, different command; see docker-compose.yml).

# The vendored browser assets, pinned by web/package-lock.json (copied below by tools.assets).
FROM node:20-slim AS assets
WORKDIR /web
COPY web/package.json web/package-lock.json ./
RUN npm ci --no-audit --no-fund --ignore-scripts

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Only the package sources (no .venv, .data secrets or launcher jars from the work tree).
COPY pyproject.toml ./
COPY botmemory ./botmemory
COPY schema ./schema
COPY graph ./graph
COPY resolvers ./resolvers
COPY learning ./learning
COPY services ./services
COPY tools ./tools
COPY web/package-lock.json ./web/
COPY --from=assets /web/node_modules ./web/node_modules
RUN python -m tools.assets --no-npm && rm -rf web/node_modules \
    && pip install . \
    && useradd --system --create-home --uid 10001 botmemory \
    && mkdir -p /app/data && chown botmemory /app/data

USER botmemory
# Production by default: without it, each container started outside compose (an API and a worker
# of their own, on a cluster) made its own throwaway master key in a data dir that is no volume.
ENV BOTMEMORY_ENV=production BOTMEMORY_DATA_DIR=/app/data BOTMEMORY_API_HOST=0.0.0.0 BOTMEMORY_API_PORT=8000
EXPOSE 8000

CMD ["python", "-m", "botmemory.serve"]
