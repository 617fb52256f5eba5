# The controller image: one process image for the binder, the webhook and housekeeping.
# Production packages only (model, actors, supervisor, k8s, cli): the local-cluster harness,
# the fakes, bench and tests are not copied, and pyproject's package list leaves them out.
#
#   docker build -t ghcr.io/cozystack/gpu-binder:0.2.0 .        (a machine with a registry)
#   make image                                                  (this repository's way: buildah,
#       with a Debian base made from Debian's packages when no registry is reachable; see
#       tools/build-image.sh)
#
# Runs as uid 65532, writes nothing outside /tmp (a read-only root filesystem is fine), and
# needs only a Python 3.11 with `venv` and libstdc++ in the base (cel-expr-python's CEL runtime
# is C++): python:3.11-slim, or Debian's python3, python3-venv and libstdc++6.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
# Empty, or the path of a CA bundle pip must trust (a build mounts it, e.g. behind a TLS proxy).
ARG PIP_CERT_FILE=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
# The dependencies first, in a layer of their own: a change of our code does not fetch them again.
COPY pyproject.toml README.md ./
RUN python3 -m venv /opt/gpu-binder \
 && python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' > /tmp/requirements.txt \
 && /opt/gpu-binder/bin/pip install ${PIP_CERT_FILE:+--cert "$PIP_CERT_FILE"} \
        "setuptools>=65" wheel -r /tmp/requirements.txt
COPY model model
COPY actors actors
COPY supervisor supervisor
COPY k8s k8s
COPY cli cli
# Our wheel, then no installer left in the runtime (pip, setuptools, wheel are build tools).
RUN /opt/gpu-binder/bin/pip install --no-deps --no-build-isolation . \
 && /opt/gpu-binder/bin/pip uninstall --yes setuptools wheel pip \
 && rm -f /opt/gpu-binder/bin/activate* /opt/gpu-binder/bin/Activate.ps1

FROM ${BASE_IMAGE}
COPY --from=build /opt/gpu-binder /opt/gpu-binder
ENV PATH=/opt/gpu-binder/bin:/usr/local/bin:/usr/bin:/bin \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
USER 65532:65532
WORKDIR /tmp
EXPOSE 9443 8080
ENTRYPOINT ["gpu-binder"]
CMD ["controller"]
# Last, so a new revision re-uses every layer above. VERSION is pyproject's version (tests/cli/
# test_version.py keeps them equal); tools/build-image.sh passes REVISION (the git commit).
ARG VERSION=0.2.0
ARG REVISION=unknown
ARG SOURCE=https://github.com/cozystack/gpu-binder
LABEL org.opencontainers.image.title="gpu-binder" \
      org.opencontainers.image.description="Places whole sets of GPU devices for KubeVirt VMs" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}"
