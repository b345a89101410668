# ghcr.io/aibrix/neocloud-node: one static binary on a distroless base, running as non-root.
#   make docker-build            (IMAGE and VERSION override the tag)
FROM rust:1.95-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p neocloud-node --bin neocloud-node \
      --target x86_64-unknown-linux-musl \
 && install -D target/x86_64-unknown-linux-musl/release/neocloud-node /out/neocloud-node

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/neocloud-node /usr/local/bin/neocloud-node
USER 65532:65532
EXPOSE 8080 10250
ENTRYPOINT ["/usr/local/bin/neocloud-node"]
CMD ["run", "--config", "/etc/neocloud-node/node.yaml"]
