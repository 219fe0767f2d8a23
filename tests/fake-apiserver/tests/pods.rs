//! Jobs, their pods, watches, exec and deletion, through kube-rs.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Server, eventually, job};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{AttachParams, DeleteParams, ListParams, PropagationPolicy, WatchEvent, WatchParams};
use kube::runtime::watcher;
use serde_json::json;
use tokio::io::AsyncWriteExt;

fn ready(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn exec(
    pods: &Api<Pod>,
    name: &str,
    command: &[&str],
    stdin: &[u8],
) -> (Vec<u8>, Vec<u8>, Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Status>) {
    let params = AttachParams::default().stdin(true).stdout(true).stderr(true);
    let mut attached = pods.exec(name, command.to_vec(), &params).await.unwrap();
    let mut writer = attached.stdin().unwrap();
    let mut out_reader = attached.stdout().unwrap();
    let mut err_reader = attached.stderr().unwrap();
    let status = attached.take_status().unwrap();
    let input = stdin.to_vec();
    // kube-rs loses the Status when it sends the end of stdin after the server has closed
    // the stream (its send fails and its task ends): stdin is closed only for `sh -s` and a
    // bare `cat`, which cannot end before they have read that end; a command that may end
    // first keeps it open.
    let close_stdin = matches!(command, ["sh", "-s"] | ["cat"]);
    let feed = tokio::spawn(async move {
        // A write to an exec that ended without a Status may fail: that is what is tested.
        let _ = writer.write_all(&input).await;
        if close_stdin {
            let _ = writer.shutdown().await;
        } else {
            std::future::pending::<()>().await;
        }
    });
    let (out, err, status) = common::read_until_status(&mut out_reader, &mut err_reader, status).await;
    feed.abort();
    drop(attached);
    (out, err, status)
}

#[tokio::test]
async fn job_pod_watch_exec_and_foreground_delete() {
    let server = Server::start(&[]).await;
    server.namespace("t1").await;
    let pods: Api<Pod> = Api::namespaced(server.client.clone(), "t1");
    let selector = "step=j1";
    let config = watcher::Config::default().labels(selector);
    let mut stream = watcher(pods.clone(), config).boxed();
    // The watch is established (its initial list done) before the Job exists, so every state
    // of its pod comes as an event.
    while !matches!(stream.try_next().await.unwrap(), Some(watcher::Event::InitDone) | None) {}
    let created = server.create_job("t1", job("j1", "echo started; sleep 1000000", json!({}))).await;
    assert_eq!(created.metadata.generation, Some(1));
    assert!(created.metadata.uid.is_some() && created.metadata.resource_version.is_some());
    let mut seen = Vec::new();
    let pod = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(event) = stream.try_next().await.unwrap() {
            match event {
                watcher::Event::Apply(pod) => {
                    seen.push(pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default());
                    if ready(&pod) {
                        return pod;
                    }
                }
                watcher::Event::InitApply(pod) => seen.push(format!("init:{:?}", pod.metadata.name)),
                _ => {}
            }
        }
        panic!("watch ended");
    })
    .await
    .unwrap();
    assert!(seen.iter().any(|p| p == "Pending"), "{seen:?}");
    let name = pod.metadata.name.clone().unwrap();
    assert!(name.starts_with("j1-") && name.len() == 8, "{name}");
    let labels = pod.metadata.labels.clone().unwrap();
    for key in ["batch.kubernetes.io/job-name", "job-name", "batch.kubernetes.io/controller-uid", "controller-uid"] {
        assert!(labels.contains_key(key), "{labels:?}");
    }
    let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.controller, owner.block_owner_deletion), ("Job", Some(true), Some(true)));
    let container = &pod.status.as_ref().unwrap().container_statuses.as_ref().unwrap()[0];
    assert!(container.ready && container.state.as_ref().unwrap().running.as_ref().unwrap().started_at.is_some());

    // Exec: stdin, stdout, stderr and the status channel.
    let (out, err, status) =
        exec(&pods, &name, &["sh", "-c", "read x; echo got:$x; echo oops >&2; echo $HOSTNAME $HOME"], b"hello\n").await;
    assert_eq!(String::from_utf8_lossy(&out), format!("got:hello\n{name} /root\n"));
    assert_eq!(String::from_utf8_lossy(&err), "oops\n");
    assert_eq!(status.unwrap().status.as_deref(), Some("Success"));
    let (_, _, status) = exec(&pods, &name, &["sh", "-s"], b"exit 3\n").await;
    let status = status.unwrap();
    assert_eq!(status.status.as_deref(), Some("Failure"));
    assert_eq!(status.reason.as_deref(), Some("NonZeroExitCode"));
    assert_eq!(
        status.message.as_deref(),
        Some("command terminated with non-zero exit code: error executing command [sh -s], exit code 3")
    );
    let cause = &status.details.unwrap().causes.unwrap()[0];
    assert_eq!((cause.reason.as_deref(), cause.message.as_deref()), (Some("ExitCode"), Some("3")));
    let (out, _, status) = exec(&pods, &name, &["cat"], b"abc").await;
    assert_eq!(out, b"abc");
    assert_eq!(status.unwrap().status.as_deref(), Some("Success"));
    let (out, _, status) = exec(&pods, &name, &["head", "-c", "10485760", "/dev/zero"], b"").await;
    assert_eq!(out.len(), 10 << 20);
    assert_eq!(status.unwrap().status.as_deref(), Some("Success"));
    let logs = pods.logs(&name, &Default::default()).await.unwrap();
    assert_eq!(logs, "started\n");

    // Foreground deletion: the Job stays with the finalizer until its pod is gone.
    let init: i32 = std::fs::read_to_string(server.dir.join("pods/t1").join(&name).join("run/init.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(std::path::Path::new(&format!("/proc/{init}")).exists());
    let jobs: Api<Job> = Api::namespaced(server.client.clone(), "t1");
    jobs.delete("j1", &DeleteParams { propagation_policy: Some(PropagationPolicy::Foreground), ..Default::default() })
        .await
        .unwrap();
    let deleting = jobs.get("j1").await.unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());
    assert!(deleting.metadata.finalizers.unwrap().contains(&"foregroundDeletion".to_string()));
    eventually(20, "pod gone", || async { pods.get_opt(&name).await.unwrap().is_none().then_some(()) }).await;
    eventually(10, "job gone", || async { jobs.get_opt("j1").await.unwrap().is_none().then_some(()) }).await;
    eventually(10, "sandbox dead", || async {
        (!std::path::Path::new(&format!("/proc/{init}")).exists()).then_some(())
    })
    .await;
    let reasons: Vec<String> = server.events("t1", &name).await.iter().filter_map(|e| e.reason.clone()).collect();
    for reason in ["Scheduled", "Pulling", "Pulled", "Created", "Started", "Killing"] {
        assert!(reasons.iter().any(|r| r == reason), "{reasons:?}");
    }
}

#[tokio::test]
async fn ttl_deadline_and_background_delete() {
    let server = Server::start(&[]).await;
    let jobs: Api<Job> = Api::namespaced(server.client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(server.client.clone(), "default");
    // Completes, then the TTL controller deletes it with its pod. The finish time has whole
    // seconds, so the deletion may follow the completion by well under a second (as upstream):
    // the completed Job is taken from a watch, which delivers it even when it is already gone.
    let created = server.create_job("default", job("quick", "exit 0", json!({"ttlSecondsAfterFinished": 1}))).await;
    let version = created.metadata.resource_version.unwrap();
    let params = WatchParams::default().fields("metadata.name=quick").timeout(30);
    let mut events = jobs.watch(&params, &version).await.unwrap().boxed();
    let complete = |job: &Job| {
        let conditions = job.status.as_ref().and_then(|status| status.conditions.as_ref());
        conditions.is_some_and(|conditions| conditions.iter().any(|c| c.type_ == "Complete" && c.status == "True"))
    };
    let done = tokio::time::timeout(Duration::from_secs(35), async {
        while let Some(event) = events.try_next().await.unwrap() {
            if let WatchEvent::Modified(job) = event
                && complete(&job)
            {
                return job;
            }
        }
        panic!("the watch ended before the Job completed");
    })
    .await
    .expect("timed out waiting for complete");
    let status = done.status.unwrap();
    assert_eq!(status.succeeded, Some(1));
    assert!(status.completion_time.is_some() && status.start_time.is_some());
    eventually(20, "ttl deletion", || async { jobs.get_opt("quick").await.unwrap().is_none().then_some(()) }).await;
    eventually(20, "ttl pods gone", || async {
        pods.list(&ListParams::default().labels("step=quick")).await.unwrap().items.is_empty().then_some(())
    })
    .await;

    // activeDeadlineSeconds: Failed with DeadlineExceeded, its pod deleted.
    server.create_job("default", job("slow", "sleep 1000000", json!({"activeDeadlineSeconds": 2}))).await;
    let failed = eventually(30, "deadline", || async {
        let job = jobs.get_opt("slow").await.unwrap()?;
        let conditions = job.status.clone()?.conditions?;
        conditions.into_iter().find(|c| c.type_ == "Failed" && c.status == "True")
    })
    .await;
    assert_eq!(failed.reason.as_deref(), Some("DeadlineExceeded"));
    assert_eq!(failed.message.as_deref(), Some("Job was active longer than specified deadline"));
    eventually(20, "deadline pods gone", || async {
        pods.list(&ListParams::default().labels("step=slow")).await.unwrap().items.is_empty().then_some(())
    })
    .await;
    let reasons: Vec<String> = server.events("default", "slow").await.iter().filter_map(|e| e.reason.clone()).collect();
    assert!(reasons.contains(&"DeadlineExceeded".to_string()), "{reasons:?}");

    // A failing pod fails the Job with backoffLimit 0.
    server.create_job("default", job("bad", "exit 2", json!({}))).await;
    let failed = eventually(30, "backoff limit", || async {
        let conditions = jobs.get_opt("bad").await.unwrap()?.status?.conditions?;
        conditions.into_iter().find(|c| c.type_ == "Failed" && c.status == "True")
    })
    .await;
    assert_eq!(failed.reason.as_deref(), Some("BackoffLimitExceeded"));
    let pod = pods.list(&ListParams::default().labels("step=bad")).await.unwrap().items.remove(0);
    let terminated = pod.status.unwrap().container_statuses.unwrap()[0].state.clone().unwrap().terminated.unwrap();
    assert_eq!((terminated.exit_code, terminated.reason.as_deref()), (2, Some("Error")));

    // Background deletion: the Job goes at once, the garbage collector takes the pod.
    server.create_job("default", job("bg", "sleep 1000000", json!({}))).await;
    let pod = eventually(30, "bg running", || async {
        pods.list(&ListParams::default().labels("step=bg")).await.unwrap().items.into_iter().find(ready)
    })
    .await;
    jobs.delete("bg", &DeleteParams::background()).await.unwrap();
    assert!(jobs.get_opt("bg").await.unwrap().is_none());
    let name = pod.metadata.name.unwrap();
    eventually(20, "bg pod gone", || async { pods.get_opt(&name).await.unwrap().is_none().then_some(()) }).await;

    // Default (batch/v1: orphan) with the upstream warning: the pod stays, without owner.
    server.create_job("default", job("orphan", "sleep 1000000", json!({}))).await;
    let pod = eventually(30, "orphan running", || async {
        pods.list(&ListParams::default().labels("step=orphan")).await.unwrap().items.into_iter().find(ready)
    })
    .await;
    jobs.delete("orphan", &DeleteParams::default()).await.unwrap();
    eventually(10, "orphan job gone", || async { jobs.get_opt("orphan").await.unwrap().is_none().then_some(()) }).await;
    let name = pod.metadata.name.unwrap();
    let kept = eventually(10, "owner removed", || async {
        let pod = pods.get_opt(&name).await.unwrap()?;
        pod.metadata.owner_references.as_ref().is_none_or(|r| r.is_empty()).then_some(pod)
    })
    .await;
    assert!(kept.metadata.deletion_timestamp.is_none());
    pods.delete(&name, &DeleteParams::default()).await.unwrap();
}

#[tokio::test]
async fn image_pulls_and_failed_create() {
    let server = Server::start(&["--pull-backoff", "300ms", "--job-backoff", "200ms"]).await;
    let pods: Api<Pod> = Api::namespaced(server.client.clone(), "default");
    let waiting = |step: &'static str, reason: &'static str| {
        let pods = pods.clone();
        async move {
            let pod = pods
                .list(&ListParams::default().labels(&format!("step={step}")))
                .await
                .unwrap()
                .items
                .into_iter()
                .next()?;
            let status = pod.status.clone()?.container_statuses?.remove(0);
            (status.state?.waiting?.reason.as_deref() == Some(reason)).then_some(pod)
        }
    };
    // Missing image: ErrImagePull, then ImagePullBackOff.
    let mut missing = job("missing", "true", json!({}));
    missing["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nosuchimage");
    server.create_job("default", missing).await;
    eventually(20, "ErrImagePull", || waiting("missing", "ErrImagePull")).await;
    let pod = eventually(20, "ImagePullBackOff", || waiting("missing", "ImagePullBackOff")).await;
    let name = pod.metadata.name.unwrap();
    let events = eventually(20, "pull events", || async {
        let events = server.events("default", &name).await;
        let has = |reason: &str, message: &str| events.iter().any(|e| e.reason.as_deref() == Some(reason) && e.message.as_deref() == Some(message));
        (has("Pulling", "Pulling image \"nosuchimage\"")
            && has("Failed", "Failed to pull image \"nosuchimage\": rpc error: code = NotFound desc = failed to pull and unpack image \"docker.io/library/nosuchimage:latest\": failed to resolve reference \"docker.io/library/nosuchimage:latest\": docker.io/library/nosuchimage:latest: not found")
            && has("Failed", "Error: ErrImagePull")
            && has("BackOff", "Back-off pulling image \"nosuchimage\"")
            && has("Failed", "Error: ImagePullBackOff")
            && events.iter().any(|e| e.reason.as_deref() == Some("Pulling") && e.count.unwrap_or(0) >= 2))
        .then_some(events)
    })
    .await;
    assert!(
        events.iter().filter(|e| e.reason.as_deref() != Some("Scheduled")).all(|e| e
            .source
            .as_ref()
            .unwrap()
            .component
            .as_deref()
            == Some("kubelet"))
    );

    // Malformed reference: InvalidImageName.
    let mut invalid = job("invalid", "true", json!({}));
    invalid["spec"]["template"]["spec"]["containers"][0]["image"] = json!("Bad Image!!");
    server.create_job("default", invalid).await;
    let pod = eventually(20, "InvalidImageName", || waiting("invalid", "InvalidImageName")).await;
    let events = server.events("default", pod.metadata.name.as_deref().unwrap()).await;
    assert!(events.iter().any(|e| e.reason.as_deref() == Some("InspectFailed")
        && e.message.as_deref() == Some("Failed to apply default image tag \"Bad Image!!\": couldn't parse image name \"Bad Image!!\": invalid reference format")));

    // pull-denied.
    server.faults(&["pull-denied"]).await;
    server.create_job("default", job("denied", "true", json!({}))).await;
    let pod = eventually(20, "denied", || waiting("denied", "ErrImagePull")).await;
    let message =
        pod.status.unwrap().container_statuses.unwrap()[0].state.clone().unwrap().waiting.unwrap().message.unwrap();
    assert!(message.contains("pull access denied, repository does not exist or may require authorization: server message: insufficient_scope: authorization failed"), "{message}");

    // failed-create: FailedCreate, no pod, retried with the count incremented.
    server.faults(&["failed-create"]).await;
    server.create_job("default", job("refused", "true", json!({}))).await;
    // PodSecurity runs after the name is generated: each retry names another pod.
    let events = eventually(20, "FailedCreate x2", || async {
        let all = server.events("default", "refused").await;
        let events: Vec<_> = all.into_iter().filter(|e| e.reason.as_deref() == Some("FailedCreate")).collect();
        (events.len() >= 2).then_some(events)
    })
    .await;
    let message = events[0].message.clone().unwrap();
    assert!(
        message.starts_with("Error creating: pods \"refused-")
            && message.contains(
                "is forbidden: violates PodSecurity \"restricted:latest\": allowPrivilegeEscalation != false"
            ),
        "{message}"
    );
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    assert!(pods.list(&ListParams::default().labels("step=refused")).await.unwrap().items.is_empty());

    // A missing service account: refused by the ServiceAccount admission plugin.
    server.faults(&[]).await;
    let mut sa = job("nosa", "true", json!({}));
    sa["spec"]["template"]["spec"]["serviceAccountName"] = json!("ghost");
    server.create_job("default", sa).await;
    // The ServiceAccount plugin runs before the name is generated: one event, counted.
    let event = eventually(20, "FailedCreate sa x2", || async {
        let all = server.events("default", "nosa").await;
        all.into_iter().find(|e| e.reason.as_deref() == Some("FailedCreate") && e.count.unwrap_or(0) >= 2)
    })
    .await;
    assert_eq!(
        event.message.as_deref(),
        Some(
            "Error creating: pods \"nosa-\" is forbidden: error looking up service account default/ghost: serviceaccount \"ghost\" not found"
        )
    );
}

#[tokio::test]
async fn mid_step_faults() {
    let server = Server::start(&[]).await;
    let pods: Api<Pod> = Api::namespaced(server.client.clone(), "default");
    let jobs: Api<Job> = Api::namespaced(server.client.clone(), "default");
    server.create_job("default", job("m", "sleep 1000000", json!({}))).await;
    let pod = eventually(30, "running", || async {
        pods.list(&ListParams::default().labels("step=m")).await.unwrap().items.into_iter().find(ready)
    })
    .await;
    let name = pod.metadata.name.unwrap();
    // drop-exec-stream: the stream ends after the first byte, without a status; the step goes on.
    server.faults(&["drop-exec-stream"]).await;
    let (out, _, status) = exec(&pods, &name, &["sh", "-s"], b"echo x; sleep 1; echo done > /tmp/marker\n").await;
    assert!(status.is_none());
    assert!(out.len() <= 2, "{out:?}");
    // The step goes on in the pod without its stream: its marker comes.
    eventually(10, "the marker of the step whose stream dropped", || async {
        let (out, _, _) = exec(&pods, &name, &["cat", "/tmp/marker"], b"").await;
        (out == b"done\n").then_some(())
    })
    .await;
    // job-deleted-mid-step: Background deletion at the first byte; the pod terminates.
    server.faults(&["job-deleted-mid-step"]).await;
    let (_, _, status) = exec(&pods, &name, &["sh", "-s"], b"echo x; sleep 1000\n").await;
    assert_eq!(status.unwrap().reason.as_deref(), Some("NonZeroExitCode"));
    assert!(jobs.get_opt("m").await.unwrap().is_none());
    eventually(20, "pod gone", || async { pods.get_opt(&name).await.unwrap().is_none().then_some(()) }).await;
}
