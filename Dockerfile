# One image for every sas_app process in docker-compose.yml; the command picks the role.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md celeryconfig.py ./
COPY src ./src
RUN pip install --no-cache-dir .
ENV SAS_APP=workers.app:sas
USER nobody
