# gpuipc images, from one build (docs/operations.md "Images" says how to use each):
#
#   docker build -t ghcr.io/gpuipc/gpuipc:0.1.0 .
#       the default target: gpuipc-broker (the entrypoint) and gpuipcctl on debian:12-slim, used as
#       the broker sidecar and as the example producer/consumer in k8s/. Runs as 65532:65532, the
#       uid/gid the manifests give the broker; the socket lives in /run/gpuipc (a volume).
#   docker build --target client -t ghcr.io/gpuipc/gpuipc-client:0.1.0 .
#       only the client: libgpuipc.so.0, gpuipcctl and the Python module (as meson installs it,
#       kept in /usr/share/gpuipc/python for the app image's own Python), in an image of its own
#       (FROM scratch) that application images copy from (examples/app-image/Dockerfile adds them
#       to a PyTorch image).
#
# Plain Dockerfile syntax without a `# syntax=` line: BuildKit, buildah and podman build it with
# their built-in frontend, so an air-gapped build needs nothing but debian:12 and debian:12-slim.
# No CUDA image either: libgpuipc declares the few driver types and entry points it uses itself
# (client/cuda.h, checked against <cuda.h> by the unit-cuda-abi test wherever the CUDA headers are
# installed) and dlopens libcuda.so.1 at run time, which the NVIDIA container runtime or the DRA
# driver's CDI spec mounts into containers that hold a GPU.

FROM debian:12 AS build
# python3 runs seccomp/gen.py; gcc also names the multiarch library directory below.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
        meson ninja-build pkg-config gcc libc6-dev python3 \
        libuv1-dev libmsgpack-dev libseccomp-dev libmicrohttpd-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# --libdir: meson asks dpkg-architecture (dpkg-dev, which --no-install-recommends leaves out) for
# Debian's multiarch directory and falls back to lib64, where the loader never looks; gcc knows the
# triplet too. seccomp is `enabled`, not `auto`: a broker without its filter must fail to build.
RUN meson setup /build --buildtype=release --prefix=/usr --libdir="lib/$(gcc -print-multiarch)" \
        -Dtests=false -Dseccomp=enabled \
 && meson compile -C /build \
 && DESTDIR=/out meson install -C /build --no-rebuild --quiet
# What each image gets, named file by file: no headers, pkg-config files, static archives or the
# unversioned .so link (build against the source tree instead), no systemd units.
RUN lib=usr/lib/$(gcc -print-multiarch) \
 && mkdir -p /stage/broker/usr/bin /stage/broker/$lib /stage/broker/usr/share /stage/client/usr/bin \
        /stage/client/$lib /stage/client/usr/share/gpuipc/python \
 && cp -a /out/usr/bin/gpuipc-broker /out/usr/bin/gpuipcctl /stage/broker/usr/bin/ \
 && cp -a /out/$lib/libgpuipc.so.0 /out/$lib/libgpuipc.so.0.* /stage/broker/$lib/ \
 && cp -a /out/usr/share/gpuipc /stage/broker/usr/share/ \
 && cp -a /out/usr/bin/gpuipcctl /stage/client/usr/bin/ \
 && cp -a /out/$lib/libgpuipc.so.0 /out/$lib/libgpuipc.so.0.* /stage/client/$lib/ \
 && find /out/usr/lib -path '*-packages/gpuipc*' -prune -exec cp -a {} /stage/client/usr/share/gpuipc/python/ \; \
 && test -n "$(ls /stage/client/usr/share/gpuipc/python)"

# The client files alone, for application images: COPY --from=<this image> / /
FROM scratch AS client
COPY --from=build /stage/client/ /

FROM debian:12-slim
LABEL org.opencontainers.image.title="gpuipc" \
      org.opencontainers.image.description="Broker and CLI for zero-copy GPU buffer sharing between containers" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
# What the broker links besides libc, and libmicrohttpd12, which the exporter (gpuipcctl metrics
# --listen) loads (tests/image checks this list against the binaries' NEEDED entries and what the
# exporter loads: nothing missing, nothing extra). gpuipcctl (the probes) needs the libgpuipc.so.0
# beside it.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libuv1 libseccomp2 libmicrohttpd12 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 gpuipc \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin gpuipc \
 && install -d -o 65532 -g 65532 -m 0750 /run/gpuipc
COPY --from=build /stage/broker/ /
RUN ldconfig
ENV GPUIPC_SOCKET=/run/gpuipc/gpuipc.sock
USER 65532:65532
ENTRYPOINT ["/usr/bin/gpuipc-broker"]
CMD ["--socket", "/run/gpuipc/gpuipc.sock", "--socket-mode", "0660", "--seccomp", "enforce", "--log-format", "json"]
