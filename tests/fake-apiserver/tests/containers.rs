//! Pods of more than one container, as the Kubernetes executor runs a workflow's services
//! beside its run: each container in a sandbox of its own, reached by name through
//! `hostAliases`; statuses, phase and readiness per container; exec and logs by container;
//! validation of the containers' names, the aliases and the variables.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Server, eventually, exec_in};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ContainerState, Pod, PodCondition};
use kube::Api;
use kube::api::{DeleteParams, ListParams, LogParams, PostParams};
use kube::runtime::watcher;
use serde_json::{Value, json};

/// The run's container: three lines of log, then it waits, and ends on TERM.
const RUN: &str = "echo one; echo two; echo three; trap \"exit 0\" TERM; while :; do sleep 3600 & wait; done";

/// A port for the web server, from the process id (unlikely to clash with another test's).
fn port() -> u16 {
    20_000 + (std::process::id() % 20_000) as u16
}

/// A Job whose pod runs `containers` (name, image, script), with `extra` in its pod spec.
fn job(name: &str, containers: &[(&str, &str, &str)], extra: Value) -> Value {
    let containers: Vec<Value> = containers
        .iter()
        .map(|(container, image, script)| json!({"name": container, "image": image, "command": ["sh", "-c", script]}))
        .collect();
    let mut job = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": {"step": name}}, "spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "containers": containers}}}
    });
    for (key, value) in extra.as_object().into_iter().flatten() {
        job["spec"]["template"]["spec"][key] = value.clone();
    }
    job
}

fn state<'a>(pod: &'a Pod, container: &str) -> Option<&'a ContainerState> {
    pod.status.as_ref()?.container_statuses.as_ref()?.iter().find(|s| s.name == container)?.state.as_ref()
}

fn running(pod: &Pod, container: &str) -> bool {
    state(pod, container).is_some_and(|s| s.running.is_some())
}

fn waiting_reason<'a>(pod: &'a Pod, container: &str) -> Option<&'a str> {
    state(pod, container)?.waiting.as_ref()?.reason.as_deref()
}

fn condition<'a>(pod: &'a Pod, kind: &str) -> Option<&'a PodCondition> {
    pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == kind)
}

fn phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("")
}

/// Watches the pods of `step` (from before they exist) until one passes `check`: every state
/// a pod goes through is seen, however short.
struct PodWatch(futures::stream::BoxStream<'static, Result<watcher::Event<Pod>, watcher::Error>>);

impl PodWatch {
    async fn start(pods: &Api<Pod>, step: &str) -> PodWatch {
        let config = watcher::Config::default().labels(&format!("step={step}"));
        let mut stream = watcher(pods.clone(), config).boxed();
        while !matches!(stream.try_next().await.unwrap(), Some(watcher::Event::InitDone) | None) {}
        PodWatch(stream)
    }

    async fn until(&mut self, seconds: u64, what: &str, check: impl Fn(&Pod) -> bool) -> Pod {
        let found = tokio::time::timeout(Duration::from_secs(seconds), async {
            while let Some(event) = self.0.try_next().await.unwrap() {
                if let watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) = event
                    && check(&pod)
                {
                    return pod;
                }
            }
            panic!("the watch ended before {what}");
        })
        .await;
        found.unwrap_or_else(|_| panic!("timed out waiting for {what}"))
    }
}

/// The host PID of each container's PID 1, from its `init.pid`.
fn init_pids(dir: &Path, namespace: &str, pod: &str, containers: &[&str]) -> Vec<i32> {
    containers
        .iter()
        .map(|container| {
            let path: PathBuf = dir.join("pods").join(namespace).join(pod).join(container).join("init.pid");
            std::fs::read_to_string(&path).unwrap().trim().parse().unwrap()
        })
        .collect()
}

/// The PID namespace of a process.
fn pid_namespace(pid: i32) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()
}

/// The processes left in any of `namespaces`.
fn processes_in(namespaces: &[PathBuf]) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| pid_namespace(*pid).is_some_and(|ns| namespaces.contains(&ns)))
        .collect()
}

/// The refusal of an exec into `container` (before any upgrade, as the API server answers it).
async fn exec_refused(server: &Server, pod: &str, container: &str) -> (u16, String) {
    let path = format!("/api/v1/namespaces/default/pods/{pod}/exec?container={container}&command=true&stdout=true");
    refusal(server.client.request_text(common::http_request("GET", &path, None, None)).await.unwrap_err())
}

/// The message of a refused request.
fn refusal(error: kube::Error) -> (u16, String) {
    match error {
        kube::Error::Api(status) => (status.code, status.message),
        other => panic!("not an API error: {other:?}"),
    }
}

#[tokio::test]
async fn a_service_beside_the_run_reached_by_name() {
    let server = Server::start(&[]).await;
    let pods: Api<Pod> = Api::namespaced(server.client.clone(), "default");
    let jobs: Api<Job> = Api::namespaced(server.client.clone(), "default");
    let port = port();
    let web =
        format!("mkdir -p /www && echo hello > /www/index.html && echo serving && exec httpd -f -p {port} -h /www");
    let mut watch = PodWatch::start(&pods, "svc").await;
    let spec = job(
        "svc",
        &[("run", "busybox", RUN), ("web", "busybox", &web)],
        json!({"hostAliases": [{"ip": "127.0.0.1", "hostnames": ["web"]}]}),
    );
    server.create_job("default", spec).await;
    let pod = watch
        .until(30, "both containers running", |pod| {
            running(pod, "run")
                && running(pod, "web")
                && phase(pod) == "Running"
                && condition(pod, "Ready").is_some_and(|c| c.status == "True")
        })
        .await;
    let name = pod.metadata.name.clone().unwrap();
    let status = pod.status.clone().unwrap();
    let names: Vec<&str> = status.container_statuses.as_ref().unwrap().iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["run", "web"]);
    for container in status.container_statuses.as_ref().unwrap() {
        assert!(container.ready && container.started == Some(true), "{container:?}");
        assert!(container.container_id.as_deref().is_some_and(|id| id.starts_with("containerd://")));
        assert_eq!(container.image, "docker.io/library/busybox:latest");
        assert!(!container.image_id.is_empty());
    }
    let ids: Vec<_> = status.container_statuses.as_ref().unwrap().iter().map(|s| s.container_id.clone()).collect();
    assert_ne!(ids[0], ids[1]);
    assert_eq!(condition(&pod, "ContainersReady").unwrap().status, "True");

    // Each container in its own root: /www is the web server's only.
    let (out, _, status) = exec_in(&pods, &name, "web", &["sh", "-c", "cat /www/index.html"]).await;
    assert_eq!((out.as_str(), status.unwrap().status.as_deref()), ("hello\n", Some("Success")));
    let (_, _, status) = exec_in(&pods, &name, "run", &["test", "-e", "/www"]).await;
    assert_eq!(status.unwrap().reason.as_deref(), Some("NonZeroExitCode"));
    assert_eq!(
        exec_refused(&server, &name, "nope").await,
        (400, format!("container nope is not valid for pod {name}"))
    );
    // Each its own PID namespace: its command is its PID 1.
    let (out, _, _) = exec_in(&pods, &name, "web", &["cat", "/proc/1/cmdline"]).await;
    assert!(out.starts_with("httpd\0"), "{out:?}");
    let (out, _, _) = exec_in(&pods, &name, "run", &["cat", "/proc/1/cmdline"]).await;
    assert!(out.starts_with("sh\0-c\0echo one"), "{out:?}");

    // The managed /etc/hosts, in every container: the pod's IP and name, then the alias.
    let ip = status_ip(&pod);
    let hosts = format!(
        "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
         fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n\
         {ip}\t{name}\n\n# Entries added by HostAliases.\n127.0.0.1\tweb\n"
    );
    for container in ["run", "web"] {
        let (out, _, _) = exec_in(&pods, &name, container, &["cat", "/etc/hosts"]).await;
        assert_eq!(out, hosts, "{container}");
    }

    // The run reaches the service by its name (the server may still be binding its port).
    let url = format!("http://web:{port}/");
    eventually(20, "the web server answers the run", || async {
        let (out, _, _) = exec_in(&pods, &name, "run", &["wget", "-q", "-O", "-", &url]).await;
        (out == "hello\n").then_some(())
    })
    .await;

    // Logs by container; the last lines with tailLines; a choice of container required.
    let log = |container: &str, tail: Option<i64>| {
        let params = LogParams { container: Some(container.to_string()), tail_lines: tail, ..LogParams::default() };
        let pods = pods.clone();
        let name = name.clone();
        async move { pods.logs(&name, &params).await }
    };
    assert_eq!(log("run", None).await.unwrap(), "one\ntwo\nthree\n");
    assert_eq!(log("run", Some(2)).await.unwrap(), "two\nthree\n");
    assert_eq!(log("run", Some(0)).await.unwrap(), "");
    assert_eq!(log("run", Some(10)).await.unwrap(), "one\ntwo\nthree\n");
    assert_eq!(log("web", None).await.unwrap(), "serving\n");
    let (code, message) = refusal(pods.logs(&name, &LogParams::default()).await.unwrap_err());
    assert_eq!(
        (code, message),
        (400, format!("a container name must be specified for pod {name}, choose one of: [run web]"))
    );
    let (code, message) = refusal(log("nope", None).await.unwrap_err());
    assert_eq!((code, message), (400, format!("container nope is not valid for pod {name}")));
    let (code, _) = refusal(log("run", Some(-1)).await.unwrap_err());
    assert_eq!(code, 422);

    // The kubelet's events name their container.
    let events = server.events("default", &name).await;
    for container in ["run", "web"] {
        let path = format!("spec.containers{{{container}}}");
        let started = events.iter().find(|e| {
            e.reason.as_deref() == Some("Started") && e.involved_object.field_path.as_deref() == Some(path.as_str())
        });
        assert_eq!(started.unwrap().message.as_deref(), Some(format!("Started container {container}").as_str()));
    }

    // Deleting the Job ends the pod and every process of both containers.
    let pids = init_pids(&server.dir, "default", &name, &["run", "web"]);
    let namespaces: Vec<PathBuf> = pids.iter().map(|pid| pid_namespace(*pid).unwrap()).collect();
    assert_ne!(namespaces[0], namespaces[1]);
    assert!(processes_in(&namespaces).len() >= 3, "sh, sleep and httpd");
    jobs.delete("svc", &DeleteParams::background()).await.unwrap();
    eventually(30, "the pod gone", || async { pods.get_opt(&name).await.unwrap().is_none().then_some(()) }).await;
    eventually(10, "every process of the pod gone", || async { processes_in(&namespaces).is_empty().then_some(()) })
        .await;
    let reasons: Vec<(String, String)> = server
        .events("default", &name)
        .await
        .iter()
        .map(|e| (e.reason.clone().unwrap_or_default(), e.message.clone().unwrap_or_default()))
        .collect();
    for container in ["run", "web"] {
        let stopping = ("Killing".to_string(), format!("Stopping container {container}"));
        assert!(reasons.contains(&stopping), "{reasons:?}");
    }
}

fn status_ip(pod: &Pod) -> String {
    pod.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap()
}

#[tokio::test]
async fn a_container_whose_image_is_missing_waits_while_the_other_runs() {
    let server = Server::start(&[]).await;
    let pods: Api<Pod> = Api::namespaced(server.client.clone(), "default");
    let mut watch = PodWatch::start(&pods, "nodb").await;
    server
        .create_job("default", job("nodb", &[("run", "busybox", RUN), ("db", "nosuchimage", "true")], json!({})))
        .await;
    let pod = watch
        .until(30, "run running, db ErrImagePull", |pod| {
            running(pod, "run") && waiting_reason(pod, "db") == Some("ErrImagePull")
        })
        .await;
    let name = pod.metadata.name.clone().unwrap();
    assert_eq!(phase(&pod), "Pending");
    let ready = condition(&pod, "Ready").unwrap();
    assert_eq!(ready.status, "False");
    assert_eq!(ready.reason.as_deref(), Some("ContainersNotReady"));
    assert_eq!(ready.message.as_deref(), Some("containers with unready status: [db]"));
    let containers_ready = condition(&pod, "ContainersReady").unwrap();
    assert_eq!(containers_ready.message.as_deref(), Some("containers with unready status: [db]"));
    let db = &pod.status.as_ref().unwrap().container_statuses.as_ref().unwrap()[1];
    assert_eq!((db.name.as_str(), db.image.as_str(), db.ready), ("db", "nosuchimage", false));
    let message = state(&pod, "db").unwrap().waiting.as_ref().unwrap().message.clone().unwrap();
    assert!(message.contains("docker.io/library/nosuchimage:latest: not found"), "{message}");
    assert!(pod.status.as_ref().unwrap().pod_ip.is_some());

    // The running container serves exec and logs; the waiting one neither.
    let (out, _, status) = exec_in(&pods, &name, "run", &["echo", "in run"]).await;
    assert_eq!((out.as_str(), status.unwrap().status.as_deref()), ("in run\n", Some("Success")));
    assert_eq!(exec_refused(&server, &name, "db").await, (400, "container not found (\"db\")".to_string()));
    let params = LogParams { container: Some("db".into()), ..LogParams::default() };
    let (code, message) = refusal(pods.logs(&name, &params).await.unwrap_err());
    assert_eq!(code, 400);
    assert!(message.starts_with(&format!("container \"db\" in pod \"{name}\" is waiting to start: ")), "{message}");

    // The image back-off is the failing container's own; its events name it.
    let pod = watch
        .until(30, "db backing off", |pod| waiting_reason(pod, "db") == Some("ImagePullBackOff") && running(pod, "run"))
        .await;
    assert_eq!(phase(&pod), "Pending");
    let events = server.events("default", &name).await;
    let about = |container: &str, reason: &str, message: &str| {
        let path = format!("spec.containers{{{container}}}");
        events.iter().any(|e| {
            e.involved_object.field_path.as_deref() == Some(path.as_str())
                && e.reason.as_deref() == Some(reason)
                && e.message.as_deref() == Some(message)
        })
    };
    assert!(about("db", "Failed", "Error: ErrImagePull"));
    assert!(about("db", "BackOff", "Back-off pulling image \"nosuchimage\""));
    assert!(about("run", "Started", "Started container run"));
    assert!(!about("run", "Failed", "Error: ErrImagePull"));

    // Deleted: the one that never started is ContainerStatusUnknown, the pod Failed.
    pods.delete(&name, &DeleteParams::default()).await.unwrap();
    let pod = watch.until(30, "the pod terminal", |pod| matches!(phase(pod), "Failed" | "Succeeded")).await;
    assert_eq!(phase(&pod), "Failed");
    let db = state(&pod, "db").unwrap().terminated.clone().unwrap();
    assert_eq!((db.exit_code, db.reason.as_deref()), (137, Some("ContainerStatusUnknown")));
    let run = state(&pod, "run").unwrap().terminated.clone().unwrap();
    assert_eq!((run.exit_code, run.reason.as_deref()), (0, Some("Completed")));
    eventually(20, "the pod gone", || async { pods.get_opt(&name).await.unwrap().is_none().then_some(()) }).await;
}

#[tokio::test]
async fn a_container_that_exits_while_the_other_runs() {
    let server = Server::start(&[]).await;
    let pods: Api<Pod> = Api::namespaced(server.client.clone(), "default");
    let jobs: Api<Job> = Api::namespaced(server.client.clone(), "default");
    let mut watch = PodWatch::start(&pods, "quits").await;
    server
        .create_job(
            "default",
            job("quits", &[("run", "busybox", RUN), ("side", "busybox", "echo bye; exit 3")], json!({})),
        )
        .await;
    let pod = watch
        .until(30, "side terminated, run running", |pod| {
            running(pod, "run") && state(pod, "side").is_some_and(|s| s.terminated.is_some())
        })
        .await;
    let name = pod.metadata.name.clone().unwrap();
    let side = state(&pod, "side").unwrap().terminated.clone().unwrap();
    assert_eq!((side.exit_code, side.reason.as_deref()), (3, Some("Error")));
    assert!(side.started_at.is_some() && side.finished_at.is_some());
    assert!(side.container_id.as_deref().is_some_and(|id| id.starts_with("containerd://")));
    let statuses = pod.status.as_ref().unwrap().container_statuses.clone().unwrap();
    assert!(!statuses[1].ready && statuses[1].started == Some(false));
    assert!(statuses[0].ready);
    assert_eq!(phase(&pod), "Running");
    let ready = condition(&pod, "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_deref(), ready.message.as_deref()),
        ("False", Some("ContainersNotReady"), Some("containers with unready status: [side]"))
    );
    // An ended container: its log stays, an exec finds it no more.
    let params = LogParams { container: Some("side".into()), ..LogParams::default() };
    assert_eq!(pods.logs(&name, &params).await.unwrap(), "bye\n");
    assert_eq!(exec_refused(&server, &name, "side").await, (400, "container not found (\"side\")".to_string()));
    let (out, _, _) = exec_in(&pods, &name, "run", &["echo", "still"]).await;
    assert_eq!(out, "still\n");
    // The Job is not done while one container runs.
    let quits = jobs.get("quits").await.unwrap();
    assert_eq!(quits.status.and_then(|s| s.failed), None);

    // The run ends on TERM with 0; one failed container fails the pod.
    let pid = init_pids(&server.dir, "default", &name, &["run"])[0];
    assert!(!server.dir.join("pods/default").join(&name).join("side/init.pid").exists());
    nix_kill_term(pid);
    let pod = watch.until(30, "the pod terminal", |pod| matches!(phase(pod), "Failed" | "Succeeded")).await;
    assert_eq!(phase(&pod), "Failed");
    let run = state(&pod, "run").unwrap().terminated.clone().unwrap();
    assert_eq!((run.exit_code, run.reason.as_deref()), (0, Some("Completed")));
    let ready = condition(&pod, "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_deref(), ready.message.as_deref()),
        ("False", Some("PodCompleted"), None)
    );
    eventually(30, "the Job failed", || async {
        let conditions = jobs.get("quits").await.unwrap().status?.conditions?;
        conditions.into_iter().find(|c| c.type_ == "Failed" && c.status == "True")
    })
    .await;

    // Every container ending with 0: the pod Succeeded, the Job Complete.
    let mut watch = PodWatch::start(&pods, "both").await;
    server
        .create_job(
            "default",
            job("both", &[("a", "busybox", "exit 0"), ("b", "busybox", "sleep 1; exit 0")], json!({})),
        )
        .await;
    let pod = watch.until(30, "the pod terminal", |pod| matches!(phase(pod), "Failed" | "Succeeded")).await;
    assert_eq!(phase(&pod), "Succeeded");
    for container in ["a", "b"] {
        let ended = state(&pod, container).unwrap().terminated.clone().unwrap();
        assert_eq!((ended.exit_code, ended.reason.as_deref()), (0, Some("Completed")), "{container}");
    }
    eventually(30, "the Job complete", || async {
        let conditions = jobs.get("both").await.unwrap().status?.conditions?;
        conditions.into_iter().find(|c| c.type_ == "Complete" && c.status == "True")
    })
    .await;
}

fn nix_kill_term(pid: i32) {
    let status = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn containers_aliases_and_variables_are_validated() {
    let server = Server::start(&[]).await;
    let jobs: Api<Job> = Api::namespaced(server.client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(server.client.clone(), "default");
    let create = |job: Value| {
        let jobs = jobs.clone();
        async move { jobs.create(&PostParams::default(), &serde_json::from_value(job).unwrap()).await }
    };
    let fields = |error: &kube::Error| -> Vec<(String, String)> {
        match error {
            kube::Error::Api(status) => status
                .details
                .as_ref()
                .map(|d| d.causes.clone())
                .unwrap_or_default()
                .into_iter()
                .map(|c| (c.reason, c.field))
                .collect(),
            other => panic!("{other:?}"),
        }
    };

    // Two containers of one name.
    let error =
        create(job("dup", &[("run", "busybox", "true"), ("run", "busybox", "true")], json!({}))).await.unwrap_err();
    assert_eq!(
        fields(&error),
        [("FieldValueDuplicate".to_string(), "spec.template.spec.containers[1].name".to_string())]
    );
    let (code, message) = refusal(error);
    assert_eq!(
        (code, message.as_str()),
        (422, "Job.batch \"dup\" is invalid: spec.template.spec.containers[1].name: Duplicate value: \"run\"")
    );

    // An alias whose IP is not one, and a hostname that is not a subdomain.
    let aliases =
        json!({"hostAliases": [{"ip": "web", "hostnames": ["ok"]}, {"ip": "10.0.0.1", "hostnames": ["Bad_Name"]}]});
    let error = create(job("alias", &[("run", "busybox", "true")], aliases)).await.unwrap_err();
    let (code, message) = refusal(error);
    assert_eq!(code, 422);
    assert!(message.starts_with("Job.batch \"alias\" is invalid: ["), "{message}");
    assert!(
        message.contains("spec.template.spec.hostAliases[0].ip: Invalid value: \"web\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"),
        "{message}"
    );
    assert!(
        message.contains("spec.template.spec.hostAliases[1].hostnames[0]: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain"),
        "{message}"
    );

    // A variable whose name starts with a digit.
    let mut bad_env = job("env", &[("run", "busybox", "true")], json!({}));
    bad_env["spec"]["template"]["spec"]["containers"][0]["env"] =
        json!([{"name": "OK_1", "value": "x"}, {"name": "1X", "value": "y"}]);
    let (code, message) = refusal(create(bad_env).await.unwrap_err());
    assert_eq!(code, 422);
    assert_eq!(
        message,
        "Job.batch \"env\" is invalid: spec.template.spec.containers[0].env[1].name: Invalid value: \"1X\": a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', and must not start with a digit (e.g. 'my.env-name',  or 'MY_ENV.NAME',  or 'MyEnvName1', regex used for validation is '[-._a-zA-Z][-._a-zA-Z0-9]*')"
    );

    // A pod is validated alike.
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {
        "containers": [{"name": "a", "image": "busybox"}, {"name": "a", "image": "busybox"}],
        "hostAliases": [{"ip": "127.0.0.01", "hostnames": ["a"]}]}});
    let error = pods.create(&PostParams::default(), &serde_json::from_value(pod).unwrap()).await.unwrap_err();
    let (code, message) = refusal(error);
    assert_eq!(code, 422);
    assert!(message.contains("spec.containers[1].name: Duplicate value: \"a\""), "{message}");
    assert!(
        message.contains("spec.hostAliases[0].ip: Invalid value: \"127.0.0.01\": must not have leading 0s"),
        "{message}"
    );
    assert!(jobs.list(&ListParams::default()).await.unwrap().items.is_empty());
}
