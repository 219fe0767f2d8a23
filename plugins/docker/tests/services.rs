//! Services beside a Docker session, against the real engine (run
//! `plugins/docker/tests/support/engine.sh` first): a busybox `httpd` reached by its name from
//! a step, health waits that fail with the service's own words, and nothing left behind.

mod support;

use knotless_testkit::RpcError;
use serde_json::{Value, json};
use support::*;

/// The networks labelled with a runner id.
fn networks_of(runner_id: &str) -> Vec<String> {
    let filter = format!("label=dev.knotless.runner={runner_id}");
    let (ok, stdout, stderr) = docker(&["network", "ls", "--filter", &filter, "--format", "{{.Name}}"]);
    assert!(ok, "{stderr}");
    String::from_utf8_lossy(&stdout).lines().map(str::to_string).collect()
}

/// A busybox web server saying `hello from $GREETING`, healthy once it answers.
fn web(health_timeout_ms: u64) -> Value {
    json!({
        "name": "web",
        "image": IMAGE,
        "command": ["sh", "-c", "mkdir -p /www && echo \"hello from $GREETING\" > /www/index.html && exec httpd -f -p 8080 -h /www"],
        "env": {"GREETING": "the service"},
        "health": "wget -q -O /dev/null http://127.0.0.1:8080/",
        "health_timeout_ms": health_timeout_ms,
    })
}

async fn start(harness: &Harness, session: &str, services: Value) -> Result<Value, RpcError> {
    let params = json!({"session": session, "timeout_ms": 60_000, "run_timeout_ms": 600_000, "services": services});
    harness.request("start", params).await
}

#[tokio::test]
async fn a_service_answers_by_its_name_once_healthy_and_goes_with_the_session() {
    let harness = initialized().await;
    let started = start(&harness, "svc", json!([web(30_000)])).await.expect("start");
    let description = started["description"].as_str().expect("a description");
    assert!(
        description.contains("with services on network") && description.ends_with(".network: web"),
        "{description}"
    );
    let ran = harness.command("svc", 0, "wget -q -O - http://web:8080/", json!({}), 30_000).await.expect("step");
    assert_eq!(ran["exit_code"], 0, "{}", harness.output("svc", 0, "stderr"));
    assert_eq!(harness.output("svc", 0, "stdout"), "hello from the service\n");
    // The session's network reaches nothing but its services.
    let network = format!("{}.network", harness.container("svc"));
    let (ok, internal, stderr) = docker(&["network", "inspect", "--format", "{{.Internal}}", &network]);
    assert!(ok, "{stderr}");
    assert_eq!(String::from_utf8_lossy(&internal).trim(), "true");
    // The service's variable is in its environment, never on a command line.
    let service = format!("{}.service.web", harness.container("svc"));
    let (ok, args, _) = docker(&["inspect", "--format", "{{json .Args}} {{json .Config.Cmd}}", &service]);
    assert!(ok);
    assert!(!String::from_utf8_lossy(&args).contains("the service"), "{}", String::from_utf8_lossy(&args));

    let stopped = harness.request("stop", json!({"session": "svc", "timeout_ms": 60_000})).await.expect("stop");
    let kinds: Vec<&str> =
        stopped["removed"].as_array().expect("removed").iter().filter_map(|r| r["kind"].as_str()).collect();
    assert_eq!(kinds, ["container", "container", "network"], "{stopped}");
    assert_eq!(networks_of(harness.runner_id()), Vec::<String>::new());
    harness.finish().await;
}

#[tokio::test]
async fn a_service_that_never_gets_healthy_or_stops_fails_the_start_and_leaves_nothing() {
    let harness = initialized().await;
    let mut sick = web(1_500);
    sick["health"] = json!("echo not yet >&2; false");
    let (code, message) = start(&harness, "sick", json!([sick])).await.expect_err("unhealthy");
    assert_eq!(code, -32001, "{message}");
    assert!(message.contains("service web did not become healthy within 1500 ms"), "{message}");
    assert!(message.contains("not yet"), "{message}");

    let gone = json!({"name": "db", "image": IMAGE, "command": ["sh", "-c", "echo cannot open the data folder; exit 3"],
        "health_timeout_ms": 30_000, "health": "true"});
    let (_, message) = start(&harness, "gone", json!([gone])).await.expect_err("stopped");
    assert!(message.contains("service db stopped before it was healthy"), "{message}");
    assert!(message.contains("cannot open the data folder"), "{message}");

    let missing = json!({"name": "db", "image": "knotless-test/no-such-image:1", "health_timeout_ms": 1000});
    let (_, message) = start(&harness, "missing", json!([missing])).await.expect_err("no image");
    assert!(message.contains("image knotless-test/no-such-image:1 is not on the docker engine"), "{message}");

    let (code, message) =
        start(&harness, "named", json!([{"name": "Web_1", "image": IMAGE, "health_timeout_ms": 1000}]))
            .await
            .expect_err("a bad name");
    assert_eq!(code, -32002, "{message}");
    assert_eq!(networks_of(harness.runner_id()), Vec::<String>::new(), "nothing left by the failed starts");
    harness.finish().await;
}

#[tokio::test]
async fn the_orphan_sweep_removes_the_services_and_network_of_a_dead_runners_kept_session_only_when_asked() {
    let runner_id = format!("knotless-test-services-sweep-{}", std::process::id());
    let mut first = for_runner(&runner_id).await;
    let params = json!({"session": "left", "timeout_ms": 60_000, "keep": true, "services": [web(30_000)]});
    first.request("start", params).await.expect("start");
    // A kept session outlives its executor, as a killed runner's does.
    first.close_input().await;
    assert_eq!(networks_of(&runner_id).len(), 1);
    assert_eq!(containers_of(&runner_id).len(), 2);
    let second = for_runner(&runner_id).await;
    // Kept: a sweep leaves it, and one with `remove_kept` takes the whole of it.
    let left = second.request("cleanup", json!({"keep": [], "timeout_ms": 60_000})).await.expect("cleanup");
    assert_eq!(left["removed"], json!([]), "{left}");
    assert_eq!((networks_of(&runner_id).len(), containers_of(&runner_id).len()), (1, 2));
    let params = json!({"keep": [], "remove_kept": true, "timeout_ms": 60_000});
    let swept = second.request("cleanup", params).await.expect("cleanup");
    assert_eq!(swept["removed"].as_array().map(Vec::len), Some(3), "{swept}");
    assert_eq!(knotless_protocol::kept::sessions(&runner_id), Vec::<String>::new(), "the mark goes with it");
    assert_eq!(networks_of(&runner_id), Vec::<String>::new());
    second.finish().await;
}

#[tokio::test]
async fn a_start_past_its_deadline_while_a_service_gets_healthy_leaves_nothing() {
    let harness = initialized().await;
    let mut slow = web(60_000);
    slow["health"] = json!("false");
    let params = json!({"session": "late", "timeout_ms": 3_000, "services": [slow]});
    let (code, message) = harness.request("start", params).await.expect_err("past its deadline");
    assert_eq!(code, -32004, "{message}");
    let runner_id = harness.runner_id().to_string();
    let gone = eventually(std::time::Duration::from_secs(30), || {
        containers_of(&runner_id).is_empty() && networks_of(&runner_id).is_empty()
    })
    .await;
    assert!(gone, "left: {:?} {:?}", containers_of(&runner_id), networks_of(&runner_id));
    harness.finish().await;
}
