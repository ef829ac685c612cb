# The stand-in for a PyTorch base image in tests/image: debian:12-slim with a python3 and msgpack,
# which is all examples/app-image/Dockerfile needs of its base (no registry is reachable from the
# test, and no Python package index).
FROM debian:12-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-msgpack \
 && rm -rf /var/lib/apt/lists/*
