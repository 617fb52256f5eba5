# The controller image: one process image for the binder, the webhook and housekeeping.
# Production packages only (model, actors, supervisor, k8s, cli): the local-cluster harness,
# the fakes, bench and tests are not copied, and pyproject's package list leaves them out.
# (Not built here: this machine has no container engine. Build with `docker build -t
# ghcr.io/cozystack/gpu-binder:0.1.0 .` where one is available.)
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY model model
COPY actors actors
COPY supervisor supervisor
COPY k8s k8s
COPY cli cli
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --uid 65532 --no-create-home nonroot
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 65532:65532
EXPOSE 9443 8080
ENTRYPOINT ["gpu-binder"]
CMD ["controller"]
