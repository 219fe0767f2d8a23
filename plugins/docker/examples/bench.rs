//! Figures for `make bench`: one trivial step through the executor against `docker exec <c>
//! true`, and a 100 MiB upload and download against `tar c | docker exec -i <c> tar x` and back.
//! Needs the engine and the test image (`plugins/docker/tests/support/engine.sh`).
//! Run: `cargo run --release -p knotless-executor-docker --example bench [ROUNDS]`.

#[path = "../tests/support/mod.rs"]
mod support;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use knotless_protocol::tarball;
use serde_json::json;
use support::{Containers, initialized};

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn show(what: &str, ours: Duration, reference: Duration, reference_name: &str) {
    let ratio = ours.as_secs_f64() / reference.as_secs_f64().max(1e-9);
    // One row of the Markdown table `make bench` prints.
    println!("| {what} (reference: {reference_name}) | {:.1} ms | {:.1} ms | {ratio:.2} |", ms(ours), ms(reference));
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let rounds: usize = std::env::args().nth(1).and_then(|text| text.parse().ok()).unwrap_or(20);
    let harness = initialized().await;
    harness.start("bench").await;
    let container = harness.container("bench");

    let mut steps = Vec::new();
    let mut execs = Vec::new();
    for round in 0..rounds {
        let started = Instant::now();
        let result = harness.command("bench", round as u32, "true", json!({}), 30_000).await;
        anyhow::ensure!(result.is_ok(), "step failed: {result:?}");
        steps.push(started.elapsed());
        let started = Instant::now();
        let status = Command::new("docker").args(["exec", &container, "true"]).status()?;
        anyhow::ensure!(status.success(), "docker exec true failed");
        execs.push(started.elapsed());
    }
    show(
        "one trivial step through the Docker executor, median",
        median(steps),
        median(execs),
        "`docker exec CONTAINER true`",
    );

    // A 100 MiB tree: 100 files of 1 MiB of incompressible bytes.
    let source = tempfile::tempdir()?;
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    for index in 0..100 {
        let mut bytes = vec![0u8; 1 << 20];
        for chunk in bytes.chunks_mut(8) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            chunk.copy_from_slice(&seed.to_le_bytes()[..chunk.len()]);
        }
        std::fs::write(source.path().join(format!("file-{index:03}")), bytes)?;
    }
    let archive = tarball::pack_dir(source.path(), Vec::new())?;

    // Rounds alternate between the executor and the reference, each into a fresh folder (the
    // previous round's removed first, untimed), so both meet the same page cache and disk.
    let transfers = rounds.div_ceil(4).max(3);
    let (mut uploads, mut tar_xs, mut downloads, mut tar_cs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..transfers {
        let clear = Command::new("docker").args(["exec", &container, "rm", "-rf", "/work/up", "/work/ref"]).status()?;
        anyhow::ensure!(clear.success(), "cannot clear the folders");
        // The copy the harness takes is made before the clock starts: the reference writes from
        // `archive` itself.
        let payload = archive.clone();
        let started = Instant::now();
        let uploaded = harness.upload("bench", "/work/up", payload).await;
        anyhow::ensure!(uploaded.is_ok(), "upload failed: {uploaded:?}");
        uploads.push(started.elapsed());
        let started = Instant::now();
        let mut tar = Command::new("docker")
            .args(["exec", "-i", &container, "sh", "-c", "mkdir -p /work/ref && tar x -C /work/ref"])
            .stdin(Stdio::piped())
            .spawn()?;
        tar.stdin.take().ok_or_else(|| anyhow::anyhow!("no stdin"))?.write_all(&archive)?;
        anyhow::ensure!(tar.wait()?.success(), "tar x failed");
        tar_xs.push(started.elapsed());

        let started = Instant::now();
        let (downloaded, bytes) = harness.download("bench", "/work/up").await;
        anyhow::ensure!(downloaded.is_ok() && bytes.len() > 100 << 20, "download {round} failed: {downloaded:?}");
        downloads.push(started.elapsed());
        let started = Instant::now();
        let output = Command::new("docker").args(["exec", &container, "tar", "c", "-C", "/work/ref", "."]).output()?;
        anyhow::ensure!(output.status.success() && output.stdout.len() > 100 << 20, "tar c failed");
        tar_cs.push(started.elapsed());
    }
    show(
        "a 100 MiB upload into a container, median",
        median(uploads),
        median(tar_xs),
        "`tar c` piped into `docker exec -i CONTAINER tar x`",
    );
    show(
        "a 100 MiB download from a container, median",
        median(downloads),
        median(tar_cs),
        "`docker exec CONTAINER tar c`",
    );

    harness
        .request("stop", json!({"session": "bench", "timeout_ms": 60_000}))
        .await
        .map_err(|error| anyhow::anyhow!("stop failed: {error:?}"))?;
    harness.finish().await;
    Ok(())
}
