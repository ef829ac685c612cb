# syntax=docker/dockerfile:1
# gpuipc image: the broker (entrypoint) and gpuipcctl, used both as the
# broker sidecar and as the example producer/consumer in k8s/.
# Runs as 65532:65532, the uid/gid the manifests set (runAsUser, runAsGroup,
# fsGroup); the socket lives in /run/gpuipc (an emptyDir in Kubernetes).
#
#   docker build -t ghcr.io/gpuipc/gpuipc:0.1.0 .

# The CUDA buffer kinds compile against cuda.h only: libcuda is dlopen'ed at
# run time (the NVIDIA container runtime or the DRA driver's CDI spec mounts
# it), never linked, so no CUDA bits reach the runtime image.
ARG CUDA_HEADERS_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu24.04

FROM ${CUDA_HEADERS_IMAGE} AS cuda-headers

FROM debian:12 AS build
# meson brings python3, which seccomp/gen.py needs to generate the profile.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
        meson ninja-build pkg-config gcc libc6-dev \
        libuv1-dev libmsgpack-dev libseccomp-dev \
 && rm -rf /var/lib/apt/lists/*
COPY --from=cuda-headers /usr/local/cuda/include/ /usr/local/cuda/include/
WORKDIR /src
COPY . .
# seccomp and cuda are `enabled`, not `auto`: an image without the broker's
# filter or without the CUDA kinds must fail to build, not ship.
RUN meson setup build --buildtype=release -Dprefix=/usr -Dtests=false \
        -Dseccomp=enabled -Dcuda=enabled -Dcuda_root=/usr/local/cuda \
 && meson compile -C build \
 && DESTDIR=/out meson install -C build \
 && rm -rf /out/usr/include /out/usr/lib/*/pkgconfig \
 && find /out -name '*.a' -delete

FROM debian:12-slim
LABEL org.opencontainers.image.title="gpuipc" \
      org.opencontainers.image.description="Broker and CLI for zero-copy GPU buffer sharing between containers" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN apt-get update \
 && apt-get install -y --no-install-recommends libuv1 libmsgpackc2 libseccomp2 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 gpuipc \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin gpuipc \
 && install -d -o 65532 -g 65532 -m 0750 /run/gpuipc
COPY --from=build /out/usr/ /usr/
# libgpuipc may land in the multiarch lib directory: refresh the loader cache.
RUN ldconfig
ENV GPUIPC_SOCKET=/run/gpuipc/gpuipc.sock
USER 65532:65532
ENTRYPOINT ["/usr/bin/gpuipc-broker"]
CMD ["--socket", "/run/gpuipc/gpuipc.sock", "--socket-mode", "0660", "--seccomp", "enforce", "--log-format", "json"]
