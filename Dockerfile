# Threadline: the API (`threadline serve`) or workers (`threadline worker`) against an external
# Postgres: set THREADLINE_DATABASE_URL (docker-compose.yml does). Provider keys come from the
# environment (THREADLINE_OPENAI_API_KEY, THREADLINE_ANTHROPIC_API_KEY, ...).
# The embedded local model is optional: `docker build --build-arg EXTRAS=local .` compiles
# llama.cpp into the image (minutes; portable: not tuned to the build machine's CPU).
FROM python:3.11-slim

ARG EXTRAS=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/var/lib/threadline \
    XDG_CACHE_HOME=/var/lib/threadline/cache \
    TIKTOKEN_CACHE_DIR=/var/lib/threadline/cache/tiktoken \
    THREADLINE_DATA_DIR=/var/lib/threadline/data \
    THREADLINE_HOST=0.0.0.0 \
    THREADLINE_PORT=8000

WORKDIR /srv/threadline
COPY pyproject.toml setup.py README.md ./
COPY app ./app
COPY migrations ./migrations
# A regular (not editable) install: the build maps migrations/ into the package (app/db), so
# nothing reads /srv/threadline afterwards.
RUN if [ -n "$EXTRAS" ]; then \
        apt-get update && apt-get install -y --no-install-recommends build-essential cmake \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install --no-cache-dir ".${EXTRAS:+[$EXTRAS]}" \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/threadline \
        --shell /usr/sbin/nologin threadline \
    && mkdir -p /var/lib/threadline/cache/tiktoken /var/lib/threadline/data \
    && chown -R threadline:threadline /var/lib/threadline
USER threadline
WORKDIR /var/lib/threadline

EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz')"]
CMD ["threadline", "serve"]
