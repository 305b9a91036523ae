# Image for the botmemory API and worker (same image, different command; see docker-compose.yml).
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
RUN pip install . \
    && useradd --system --create-home --uid 10001 botmemory \
    && mkdir -p /app/data && chown botmemory /app/data

USER botmemory
ENV BOTMEMORY_DATA_DIR=/app/data BOTMEMORY_API_HOST=0.0.0.0 BOTMEMORY_API_PORT=8000
EXPOSE 8000

CMD ["python", "-m", "botmemory.serve"]
