# Threadline API (and, from the worker issue on, workers). The image expects an external
# Postgres: set THREADLINE_DATABASE_URL (docker-compose.yml does).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    THREADLINE_HOST=0.0.0.0 \
    THREADLINE_PORT=8000

WORKDIR /srv/threadline
COPY pyproject.toml README.md alembic.ini ./
COPY app ./app
COPY migrations ./migrations
# Editable, so the code finds migrations/ beside app/ as it does in a checkout.
RUN pip install --no-cache-dir -e . \
    && useradd --system --home-dir /srv/threadline threadline
USER threadline

EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz')"
CMD ["threadline", "serve"]
