//! `courier-pipeline health URL`: the container's health check.

use anyhow::Context;
use std::time::Duration;

/// `GET url` answered 200 within 2 s (the container's health check: no curl in the image).
pub(crate) fn run(url: &str) -> anyhow::Result<()> {
    let answer = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(
            courier_wire::http_client::HttpClient::new(Duration::from_secs(2), 64 * 1024)
                .get(url, &[]),
        )
        .context("health")?;
    anyhow::ensure!(
        answer.status == 200,
        "health: {url} answered {}",
        answer.status
    );
    Ok(())
}
