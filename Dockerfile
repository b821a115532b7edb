# The code location image: oaipmh-dagster with its Dagster set (dagster, the webserver,
# dagster-postgres), serving the definitions over gRPC with `dagster code-server start`.
# The same image runs the webserver and the daemon in deploy/docker/compose.yaml, and
# the runs that the DefaultRunLauncher starts from the code server.
#
#   docker build -t oaipmh-dagster .
#   docker build --build-arg EXTRAS="[k8s]" -t oaipmh-dagster .   # for deploy/k8s
#
# EXTRAS adds a run launcher's package, pinned with the Dagster set: "[k8s]" for
# deploy/k8s, "[docker]" for deploy/docker/dagster.yaml, "[celery-k8s]" for deploy/celery.
#
# Mount the instance file at $DAGSTER_HOME/dagster.yaml (deploy/postgres/dagster.yaml)
# and set DAGSTER_PG_* and OAIPMH_DATABASE_URL: see deploy/README.md.
FROM python:3.12-slim

# OAIPMH_REQUIRE_DATABASE_URL: without OAIPMH_DATABASE_URL the code location fails to
# load (its error names the variable) instead of keeping the registry in a SQLite file
# inside the container.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    DAGSTER_HOME=/opt/dagster/dagster_home \
    OAIPMH_REQUIRE_DATABASE_URL=1

ARG EXTRAS=""

WORKDIR /opt/dagster/app
COPY pyproject.toml README.md ./
COPY oaipmh_dagster ./oaipmh_dagster
COPY workspace-grpc.yaml ./

RUN pip install --no-cache-dir . && mkdir -p "$DAGSTER_HOME"
RUN test -z "$EXTRAS" || pip install --no-cache-dir ".$EXTRAS"

# An unprivileged user: harvests need only the network and the databases.
RUN useradd --system --uid 10001 --home-dir /opt/dagster dagster \
    && chown -R dagster /opt/dagster
USER dagster

EXPOSE 4266
CMD ["dagster", "code-server", "start", "-m", "oaipmh_dagster.definitions", "--location-name", "oaipmh_dagster", "-h", "0.0.0.0", "-p", "4266"]
