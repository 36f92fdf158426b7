# courier-pipeline: one image, every role (the command picks it).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin courier-pipeline

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 courier
COPY --from=build /src/target/release/courier-pipeline /usr/local/bin/courier-pipeline
COPY broker-config /etc/courier-pipeline/broker-config
USER courier
ENTRYPOINT ["courier-pipeline"]
CMD ["--help"]
