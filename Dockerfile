# clusterwatch in a container: the collector, or an agent (simulated GPUs in docker-compose.yml;
# NVML on a real GPU node run with the NVIDIA container toolkit, see docs/operators.md).
#
#   docker build -t clusterwatch .
#   docker run --rm clusterwatch --help
#
# Only the package's sources are copied (not .venv, tests or build output), so the build context
# needs no .dockerignore to stay small and the image holds exactly what `pip install .` installs.
FROM python:3.11-slim

# git: the agent records the provenance (commit, dirty state) of the code each watched process runs.
RUN apt-get update \
    && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY pyproject.toml README.md ./
COPY clusterwatch ./clusterwatch
COPY agent ./agent
COPY collector ./collector
COPY cli ./cli
COPY proto ./proto
# A regular (not editable) install, then the sources go: the image runs the installed wheel only.
RUN pip install --no-cache-dir . \
    && cd / && rm -rf /src

WORKDIR /
# The store (collector) and the spool with the training-report socket (agent) live here.
RUN mkdir -p /var/lib/clusterwatch /run/clusterwatch
ENTRYPOINT ["clusterwatch"]
CMD ["--help"]
