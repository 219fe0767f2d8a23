//! The Kubernetes executor on the oldest and the newest cluster versions it supports (the
//! guide's "Supported clusters"), against the fake API server told which version to be: before
//! 1.30 an exec's websocket speaks `v4.channel.k8s.io` alone, whose stdin ends only with the
//! connection (and the exec's Status with it); from 1.30 `v5.channel.k8s.io`, with its CLOSE
//! signal. Every exec the executor makes (an upload, a step, a service's health command, the
//! sweep after a secret-bearing step, a download) ends with its exit code on either.

#[allow(dead_code)]
mod support;

use std::collections::BTreeMap;
use std::io::Read as _;
use std::time::{Duration, Instant};

use knotless_protocol::Service;
use knotless_testkit::conformance;
use support::*;
use tokio_util::sync::CancellationToken;

/// The oldest version the executor supports: its exec speaks v4 alone.
const OLDEST: &str = "1.27.0";

/// The newest version the executor supports: its exec speaks v5.
const NEWEST: &str = "1.37.0";

/// Bytes no line-based or text reading would carry whole: every byte value, lines that look like
/// a length and an end (`0\n`), and no newline at the end.
fn awkward_bytes(len: usize) -> Vec<u8> {
    let mut bytes = b"0\n\n12\n0\n".to_vec();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    while bytes.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        bytes.extend_from_slice(&state.to_le_bytes());
    }
    bytes.truncate(len);
    bytes
}

/// A checkout of a few MiB: a large file of every byte value, an executable, a symlink, an
/// empty folder and a file that is only the end of a framed stream.
fn checkout(large: &[u8]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut add = |name: &str, mode: u32, data: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(mode);
        builder.append_data(&mut header, name, data).expect("append");
    };
    add("large.bin", 0o644, large);
    add("run.sh", 0o755, b"#!/bin/sh\necho ran\n");
    add("end", 0o644, b"0\n");
    let mut folder = tar::Header::new_gnu();
    folder.set_entry_type(tar::EntryType::Directory);
    folder.set_mode(0o755);
    folder.set_size(0);
    builder.append_data(&mut folder, "empty/", std::io::empty()).expect("folder");
    let mut link = tar::Header::new_gnu();
    link.set_entry_type(tar::EntryType::Symlink);
    link.set_size(0);
    builder.append_link(&mut link, "link", "run.sh").expect("link");
    builder.into_inner().expect("finish")
}

/// The cluster's `/version`, as a client reads it.
async fn reported_version(cluster: &Cluster) -> String {
    let kubeconfig = kube::config::Kubeconfig::read_from(&cluster.kubeconfig).expect("the kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await.expect("a config");
    let client = kube::Client::try_from(config).expect("a client");
    client.apiserver_version().await.expect("/version").git_version
}

/// A run on a cluster of `version`: a service waited for by its health command, an upload of
/// awkward bytes, steps that read them (one given a secret, so the sweep runs, one reading its
/// stdin), and the download of what they wrote, each exec ending with its exit code, in time.
async fn a_whole_run_on(version: &str) {
    let cluster = Cluster::with(&["--kubernetes-version", version, "--grace", "2s"]);
    assert_eq!(reported_version(&cluster).await, format!("v{version}"));
    let host = cluster.host(&Cluster::runner_id()).await;
    let mut params = start_params("versions");
    params.services = vec![Service {
        name: "helper".to_string(),
        image: "busybox".to_string(),
        command: Some(vec!["sh".into(), "-c".into(), "touch /tmp/up; exec sleep 3600".into()]),
        env: BTreeMap::new(),
        health: Some("test -e /tmp/up".to_string()),
        health_timeout_ms: 60_000,
    }];
    let started = Instant::now();
    let session = host.open(params, &CancellationToken::new()).await.expect("start, its service healthy");
    eprintln!("{version}: started in {:?}", started.elapsed());

    let large = awkward_bytes(3 * 1024 * 1024 + 333);
    let never = CancellationToken::new();
    let started = Instant::now();
    session
        .upload("/work", checkout(&large).as_slice(), 64 << 20, Duration::from_secs(60), &never)
        .await
        .expect("the upload");
    eprintln!("{version}: uploaded in {:?}", started.elapsed());

    let script = "cat /work/end; ./run.sh; ./link; test -d /work/empty && echo empty; cat; echo read-stdin; \
                  cp /work/large.bin /outputs/copy.bin; printf \"$TOKEN\" > /outputs/secret; exit 3";
    let ran = step(&session, script, 60_000, &[("TOKEN", "s3cret")]).await;
    let result = ran.result.expect("a result");
    assert_eq!(result.exit_code, 3, "{}", ran.stderr);
    assert_eq!(ran.stdout, "0\nran\nran\nempty\nread-stdin\n", "{}", ran.stderr);

    let outputs = tempfile::tempdir().expect("tempdir");
    let started = Instant::now();
    session
        .download("/outputs", outputs.path(), 64 << 20, Duration::from_secs(60), &never)
        .await
        .expect("the download");
    eprintln!("{version}: downloaded in {:?}", started.elapsed());
    let mut copy = Vec::new();
    std::fs::File::open(outputs.path().join("copy.bin")).expect("copy").read_to_end(&mut copy).expect("read");
    assert!(copy == large, "the bytes came back whole ({} of {} bytes)", copy.len(), large.len());
    assert_eq!(std::fs::read_to_string(outputs.path().join("secret")).expect("secret"), "s3cret");

    stop(session).await.expect("stop");
    host.shutdown().await;
    cluster.wait_clean();
}

#[tokio::test]
async fn a_whole_run_works_on_the_oldest_supported_cluster_whose_exec_speaks_v4_alone() {
    a_whole_run_on(OLDEST).await;
}

#[tokio::test]
async fn a_whole_run_works_on_the_newest_supported_cluster_whose_exec_speaks_v5() {
    a_whole_run_on(NEWEST).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oldest_supported_cluster_passes_the_conformance_suite() {
    // Three nodes: the suite runs sessions at once, one node each.
    let cluster = Cluster::with(&["--kubernetes-version", OLDEST, "--grace", "2s", "--nodes", "3"]);
    assert_eq!(reported_version(&cluster).await, format!("v{OLDEST}"));
    let options = cluster.options();
    let options: Vec<(&str, &str)> = options.iter().map(|(key, value)| (key.as_str(), value.as_str())).collect();
    let program = conformance::program(env!("CARGO_BIN_EXE_knotless-executor-kubernetes"), &options);
    let checks = conformance::assert_passes(program).await;
    assert_eq!(checks.len(), conformance::case::all().count());
}
