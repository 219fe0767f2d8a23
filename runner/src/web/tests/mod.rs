//! The status page over a real socket, on a state folder made by hand: what a request may reach
//! (only what the records name), escaping, headers, the JSON, and the credentials of a public
//! page.

mod live;

use std::path::Path;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::*;
use crate::checks::{CheckRecord, CheckStore, CheckTarget};
use crate::queue::BatchStatus;
use crate::report::{OutputFile, RunStatus, StepReport, StepStatus};
use crate::workflow::Event;

/// A 1x1 PNG.
const PNG: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f, 0x15, 0xc4, 0x89, 0x00, 0x00, 0x00, 0x0d, 0x49,
    0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8, 0xcf, 0xc0, 0xf0, 0x1f, 0x00, 0x05, 0x00, 0x01, 0xff, 0x89, 0x99, 0x3d,
    0x1d, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
];

fn record(key: &str, run_id: &str, outputs: &[&str]) -> CheckRecord {
    let target = CheckTarget {
        event: Event::Push,
        commit: "0123456789abcdef0123456789abcdef01234567".into(),
        git_ref: "refs/heads/main".into(),
        pull: None,
        head: None,
        base: None,
    };
    let mut record = CheckRecord::queued(run_id.into(), ("/srv/repo", key), "build", &target, true, "me");
    record.status = RunStatus::Success;
    record.steps = vec![
        StepReport {
            name: "<script>alert(1)</script>".into(),
            status: StepStatus::Success,
            exit_code: Some(0),
            duration_ms: 5,
            reason: None,
        },
        StepReport {
            name: "red \u{1b}[31m".into(),
            status: StepStatus::Failure,
            exit_code: Some(3),
            duration_ms: 7,
            reason: None,
        },
    ];
    record.outputs = outputs.iter().map(|path| OutputFile { path: path.to_string(), bytes: 1, image: false }).collect();
    record
}

/// `<state>` with two repositories (`repo-a` with run `run-a` and its outputs, `repo-b` with
/// `run-b`), the secrets key, `state.json` and a merge queue.
fn state_folder(state: &Path) {
    let store = CheckStore::new(state);
    store
        .put(&record(
            "repo-a",
            "run-a",
            &["plot.png", "notes.txt", "pic.svg", "link", "up/secrets-key.json", "d/a b#?%.txt"],
        ))
        .expect("put");
    store.put_log("repo-a", "run-a", "[s] out \u{1b}[2J <b>bold</b>\n==> success\n").expect("log");
    store.put(&record("repo-b", "run-b", &["plot.png"])).expect("put");
    let outputs = state.join("outputs/repo-a/run-a");
    std::fs::create_dir_all(&outputs).expect("mkdir");
    std::fs::write(outputs.join("plot.png"), PNG).expect("write");
    std::fs::write(outputs.join("notes.txt"), "<i>note</i>\n").expect("write");
    std::fs::write(outputs.join("pic.svg"), "<svg xmlns='http://www.w3.org/2000/svg'><script>alert(1)</script></svg>")
        .expect("write");
    std::fs::write(outputs.join("unlisted.txt"), "not in the record").expect("write");
    std::fs::create_dir_all(outputs.join("d")).expect("mkdir");
    std::fs::write(outputs.join("d/a b#?%.txt"), "odd name").expect("write");
    std::fs::write(state.join("secrets-key.json"), "SECRET-KEY").expect("write");
    std::os::unix::fs::symlink(state.join("secrets-key.json"), outputs.join("link")).expect("symlink");
    std::os::unix::fs::symlink(state, outputs.join("up")).expect("symlink");
    std::fs::create_dir_all(state.join("outputs/repo-b/run-b")).expect("mkdir");
    std::fs::write(state.join("outputs/repo-b/run-b/plot.png"), PNG).expect("write");
    std::fs::write(
        state.join("state.json"),
        r#"{"repositories": {"repo-a": {"url": "/srv/repo", "seen": {"branches": {"main": "0123456789abcdef0123456789abcdef01234567"}, "pulls": {}}}}}"#,
    )
    .expect("state.json");
    let ejected = crate::queue::Entry {
        number: 7,
        head: "feedfacefeedfacefeedfacefeedfacefeedface".into(),
        state: crate::queue::EntryState::Ejected,
        reason: Some("pre-flight <script>x</script> failed \u{1b}[31m".into()),
        preflights: vec!["run-a".into()],
        batch: None,
        queued_at: 0,
        dequeued: true,
        retry: false,
    };
    let batch = crate::queue::BatchRecord {
        commit: "badbadbadbadbadbadbadbadbadbadbadbadbadb".into(),
        base: "0123456789abcdef0123456789abcdef01234567".into(),
        pulls: vec![7, 8],
        status: BatchStatus::Failed,
        runs: vec!["run-a".into(), "run-gone".into()],
        cause: Some("build failed".into()),
    };
    let queue = crate::queue::QueueState {
        repository: "/srv/repo".into(),
        branch: "release/1".into(),
        entries: vec![ejected],
        batches: vec![batch],
    };
    crate::queue::QueueStore::new(state).save("repo-a", &queue).expect("queue");
}

fn summary() -> RunnerSummary {
    RunnerSummary {
        runner_id: "me".into(),
        executor_name: "fake".into(),
        executor: None,
        protocol_version: Some(1),
        capabilities: None,
        concurrency: 2,
        poll_seconds: 60,
        pulls: false,
        queue: false,
        started_at: 0,
    }
}

/// A response: its status, its headers (lowercase names) and its body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
    }
}

/// Sends `request_line` (method and path, sent as given: no client normalizes it) with
/// `headers`, and reads the whole answer.
async fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Answer {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("Content-Length: 0\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes).await.expect("read");
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a head");
    let mut lines = head.lines();
    let status =
        lines.next().and_then(|line| line.split(' ').nth(1)).and_then(|code| code.parse().ok()).expect("a status");
    let headers = lines
        .filter_map(|line| line.split_once(": "))
        .map(|(name, value)| (name.to_ascii_lowercase(), value.to_string()))
        .collect();
    Answer { status, headers, body: body.to_string() }
}

async fn get(addr: SocketAddr, path: &str) -> Answer {
    send(addr, "GET", path, &[]).await
}

async fn serve(state: &Path, public: bool, token: Option<&str>) -> SocketAddr {
    serve_behind(state, public, token, None).await
}

async fn serve_behind(
    state: &Path,
    public: bool,
    token: Option<&str>,
    trusted_proxy: Option<std::net::IpAddr>,
) -> SocketAddr {
    let addr = "127.0.0.1:0".parse().expect("addr");
    let config = WebConfig { addr, public, token: token.map(str::to_string), trusted_proxy };
    start(config, View::new(state, summary())).await.expect("start")
}

#[tokio::test]
async fn only_what_a_check_record_names_is_served_and_everything_else_is_404() {
    let dir = tempfile::tempdir().expect("tempdir");
    state_folder(dir.path());
    let addr = serve(dir.path(), false, None).await;
    let png = get(addr, "/repositories/repo-a/checks/run-a/outputs/plot.png").await;
    assert_eq!(png.status, 200);
    assert_eq!(png.header("content-type"), Some("image/png"));
    let out = "/repositories/repo-a/checks/run-a/outputs";
    let refused = [
        format!("{out}/../../../secrets-key.json"),
        format!("{out}/%2e%2e/%2e%2e/%2e%2e/secrets-key.json"),
        format!("{out}/..%2F..%2F..%2Fsecrets-key.json"),
        format!("{out}//etc/passwd"),
        format!("{out}/%2Fetc%2Fpasswd"),
        format!("{out}/link"),
        format!("{out}/up/secrets-key.json"),
        format!("{out}/unlisted.txt"),
        format!("{out}/"),
        "/repositories/repo-a/checks/run-b".into(),
        "/repositories/repo-a/checks/run-b/log".into(),
        "/repositories/repo-a/checks/run-b/log/live".into(),
        "/repositories/repo-a/checks/run-b/outputs/plot.png".into(),
        "/api/repositories/repo-a/checks/run-b".into(),
        "/repositories/repo-a/checks/..%2F..%2Frepo-b%2Frun-b".into(),
        "/repositories/repo-a/checks/run-a.json".into(),
        "/repositories/..%2Fsecrets-key.json".into(),
        "/repositories/../secrets-key.json".into(),
        "/repositories/%2Fetc/checks/passwd".into(),
        "/repositories/repo-a/queue/..%2F..%2Fstate".into(),
        "/api/repositories/repo-a/queue/../../state".into(),
        "/secrets-key.json".into(),
        "/state.json".into(),
        "/static/../secrets-key.json".into(),
        "/api/../secrets-key.json".into(),
        "/api/repositories/nope/checks".into(),
    ];
    for path in &refused {
        let answer = get(addr, path).await;
        assert_eq!(answer.status, 404, "{path}: {}", answer.body);
        assert!(!answer.body.contains("SECRET-KEY"), "{path}");
    }
    // The same run through its own repository is there.
    assert_eq!(get(addr, "/repositories/repo-b/checks/run-b").await.status, 200);
}

#[tokio::test]
async fn names_logs_and_outputs_show_as_text_and_svg_is_sandboxed() {
    let dir = tempfile::tempdir().expect("tempdir");
    state_folder(dir.path());
    let addr = serve(dir.path(), false, None).await;
    let page = get(addr, "/repositories/repo-a/checks/run-a").await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{}", page.body);
    assert!(!page.body.contains("<script>alert"), "{}", page.body);
    assert!(!page.body.contains('\u{1b}'), "a raw escape reached the page");
    assert!(
        page.body.contains("red \\x1b[31m") && page.body.contains("out \\x1b[2J &lt;b&gt;bold&lt;/b&gt;"),
        "{}",
        page.body
    );
    assert!(page.body.contains("&lt;i&gt;note&lt;/i&gt;"), "a text output is previewed: {}", page.body);
    assert!(page.body.contains(r#"<img class="output" src="/repositories/repo-a/checks/run-a/outputs/plot.png""#));
    assert!(!page.body.contains("<script src"), "a finished check's page has no script");
    assert_eq!(page.header("content-security-policy"), Some(PAGE_CSP));
    assert_eq!(page.header("x-content-type-options"), Some("nosniff"));
    let svg = get(addr, "/repositories/repo-a/checks/run-a/outputs/pic.svg").await;
    assert_eq!(svg.status, 200);
    assert_eq!(svg.header("content-type"), Some("image/svg+xml"));
    assert_eq!(svg.header("content-security-policy"), Some(outputs::OUTPUT_CSP));
    assert_eq!(svg.header("x-content-type-options"), Some("nosniff"));
    let text = get(addr, "/repositories/repo-a/checks/run-a/outputs/notes.txt").await;
    assert_eq!(text.header("content-type"), Some("application/octet-stream"));
    assert_eq!(text.header("content-disposition"), Some("attachment; filename*=UTF-8''notes.txt"));
    let odd = "/repositories/repo-a/checks/run-a/outputs/d/a%20b%23%3F%25.txt";
    assert!(page.body.contains(&format!(r#"href="{odd}""#)), "{}", page.body);
    let served = get(addr, odd).await;
    assert_eq!((served.status, served.body.as_str()), (200, "odd name"));
    assert_eq!(served.header("content-disposition"), Some("attachment; filename*=UTF-8''a%20b%23%3F%25.txt"));
    let log = get(addr, "/repositories/repo-a/checks/run-a/log").await;
    assert_eq!(log.header("content-type"), Some("text/plain; charset=utf-8"));
    assert!(log.body.contains("out \\x1b[2J <b>bold</b>"), "{}", log.body);
    let queue = get(addr, "/repositories/repo-a/queue/release%2F1").await;
    assert_eq!(queue.status, 200, "{}", queue.body);
    assert!(queue.body.contains("pre-flight &lt;script&gt;x&lt;/script&gt; failed \\x1b[31m"), "{}", queue.body);
    assert!(queue.body.contains(r#"href="/repositories/repo-a/checks/run-a""#), "{}", queue.body);
    assert!(queue.body.contains("run-gone (no record)") && queue.body.contains("build failed"), "{}", queue.body);
    let repository = get(addr, "/repositories/repo-a").await;
    assert!(repository.body.contains(r#"href="/repositories/repo-a/queue/release/1""#), "{}", repository.body);
    for path in ["/", "/runner", "/repositories/repo-a", "/repositories/repo-a/queue/release/1"] {
        let answer = get(addr, path).await;
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
    }
}

#[tokio::test]
async fn the_api_gives_the_records_checks_json_prints() {
    let dir = tempfile::tempdir().expect("tempdir");
    state_folder(dir.path());
    let addr = serve(dir.path(), false, None).await;
    let records = CheckStore::new(dir.path()).list("repo-a").expect("list");
    let printed = format!("{}\n", serde_json::to_string_pretty(&records).expect("json"));
    let answer = get(addr, "/api/repositories/repo-a/checks").await;
    assert_eq!(answer.header("content-type"), Some("application/json"));
    assert_eq!(answer.body, printed);
    let one = get(addr, "/api/repositories/repo-a/checks/run-a").await;
    assert_eq!(serde_json::from_str::<CheckRecord>(&one.body).expect("a record"), records[0]);
    let runner: serde_json::Value = serde_json::from_str(&get(addr, "/api/runner").await.body).expect("json");
    assert_eq!(runner["runner_id"], "me");
    let queue: serde_json::Value =
        serde_json::from_str(&get(addr, "/api/repositories/repo-a/queue/release/1").await.body).expect("json");
    assert_eq!(queue["entries"][0]["reason"], "pre-flight <script>x</script> failed \u{1b}[31m");
}

#[tokio::test]
async fn a_public_page_asks_for_the_token_or_a_session_from_a_one_time_link() {
    let dir = tempfile::tempdir().expect("tempdir");
    state_folder(dir.path());
    let token = "0123456789abcdef0123456789abcdef";
    let addr = serve(dir.path(), true, Some(token)).await;
    let bearer = format!("Bearer {token}");
    assert_eq!(get(addr, "/").await.status, 401);
    assert_eq!(get(addr, "/api/repositories/repo-a/checks").await.status, 401);
    assert_eq!(send(addr, "GET", "/", &[("Authorization", "Bearer wrong")]).await.status, 401);
    assert_eq!(send(addr, "GET", "/", &[("Authorization", &bearer)]).await.status, 200);
    assert_eq!(send(addr, "POST", "/login-link", &[]).await.status, 401);
    let link = send(addr, "POST", "/login-link", &[("Authorization", &bearer)]).await;
    assert_eq!(link.status, 200);
    let path = link.body.trim().to_string();
    assert!(path.starts_with("/login/"), "{path}");
    let opened = get(addr, &path).await;
    assert_eq!(opened.status, 303);
    let cookie = opened.header("set-cookie").expect("a cookie").split(';').next().expect("name=value").to_string();
    assert!(
        opened
            .header("set-cookie")
            .is_some_and(|value| value.contains("HttpOnly") && value.contains("SameSite=Strict"))
    );
    assert_eq!(send(addr, "GET", "/", &[("Cookie", &cookie)]).await.status, 200);
    assert_eq!(get(addr, &path).await.status, 404, "a link opens once");
}

#[test]
fn a_page_open_to_the_network_needs_public_and_a_token() {
    let config = |addr: &str, public: bool, token: Option<&str>| WebConfig {
        addr: addr.parse().expect("addr"),
        public,
        token: token.map(str::to_string),
        trusted_proxy: None,
    };
    let token = "0123456789abcdef0123456789abcdef";
    for (addr, public, token, allowed) in [
        ("127.0.0.1:0", false, None, true),
        ("[::1]:8080", false, None, true),
        ("0.0.0.0:8080", false, None, false),
        ("[::]:8080", false, Some(token), false),
        ("192.0.2.1:8080", false, Some(token), false),
        ("0.0.0.0:8080", true, None, false),
        ("0.0.0.0:8080", true, Some("short"), false),
        ("0.0.0.0:8080", true, Some(token), true),
    ] {
        let checked = config(addr, public, token).check();
        assert_eq!(checked.is_ok(), allowed, "{addr} public={public} token={token:?}: {checked:?}");
    }
}

/// A rerun's page links the run it repeats, and the repeated run's page links its reruns;
/// a hostile id in a record is escaped in the link.
#[tokio::test]
async fn a_rerun_and_the_run_it_repeats_link_each_other() {
    let dir = tempfile::tempdir().expect("tempdir");
    state_folder(dir.path());
    let store = CheckStore::new(dir.path());
    let mut again = record("repo-a", "run-again", &[]);
    again.reruns = Some("run-a".into());
    store.put(&again).expect("put");
    let mut old = store.get("repo-a", "run-a").expect("run-a");
    old.run_again_as = vec!["run-again".into(), "x\"><script>".into()];
    store.put(&old).expect("put");
    let addr = serve(dir.path(), false, None).await;
    let page = get(addr, "/repositories/repo-a/checks/run-again").await;
    assert!(
        page.body.contains(r#"<th>repeats</th><td><a href="/repositories/repo-a/checks/run-a">run run-a</a>"#),
        "{}",
        page.body
    );
    let page = get(addr, "/repositories/repo-a/checks/run-a").await;
    assert!(
        page.body.contains(r#"<a href="/repositories/repo-a/checks/run-again">run run-again</a>"#),
        "{}",
        page.body
    );
    assert!(!page.body.contains("<script>") && page.body.contains("%22%3E%3Cscript%3E"), "{}", page.body);
}

/// A repository's checks come a page at a time, the newest first, with the total and a link
/// to the next page; a page that is not a positive number is refused.
#[tokio::test]
async fn the_api_pages_a_repository_s_checks_from_the_newest() {
    let dir = tempfile::tempdir().expect("tempdir");
    state_folder(dir.path());
    let store = CheckStore::new(dir.path());
    for n in 0..150u64 {
        let mut check = record("repo-c", &format!("run-{n:03}"), &[]);
        check.queued_at = 1_000 + n;
        store.put(&check).expect("put");
    }
    let addr = serve(dir.path(), false, None).await;
    let ids = |answer: &Answer| -> Vec<String> {
        let records: Vec<serde_json::Value> = serde_json::from_str(&answer.body).expect("json");
        records.iter().map(|record| record["run_id"].as_str().expect("id").to_string()).collect()
    };
    let first = get(addr, "/api/repositories/repo-c/checks").await;
    assert_eq!((first.status, first.header("x-total-count")), (200, Some("150")));
    let shown = ids(&first);
    assert_eq!((shown.len(), shown[0].as_str(), shown[99].as_str()), (100, "run-050", "run-149"));
    assert_eq!(first.header("link"), Some(r#"</api/repositories/repo-c/checks?page=2&per_page=100>; rel="next""#));
    let second = get(addr, "/api/repositories/repo-c/checks?page=2&per_page=100").await;
    let shown = ids(&second);
    assert_eq!((shown.len(), shown[0].as_str(), shown[49].as_str()), (50, "run-000", "run-049"));
    assert_eq!(second.header("link"), None, "the oldest page is the last");
    let small = get(addr, "/api/repositories/repo-c/checks?per_page=10&page=3").await;
    assert_eq!(ids(&small).first().map(String::as_str), Some("run-120"));
    for bad in ["page=0", "per_page=0", "per_page=1001", "page=x", "page=-1"] {
        let refused = get(addr, &format!("/api/repositories/repo-c/checks?{bad}")).await;
        assert_eq!(refused.status, 400, "{bad}: {}", refused.body);
    }
}

/// A public page shows no path of the runner's host: no outputs folder in a record, paths in a
/// cause and in the sweep's notes as `PATH`; a page on loopback shows them.
#[tokio::test]
async fn a_public_page_shows_no_host_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    state_folder(dir.path());
    let store = CheckStore::new(dir.path());
    let mut check = store.get("repo-a", "run-a").expect("run-a");
    check.outputs_dir = Some("/var/lib/knotless/outputs/repo-a/run-a".into());
    check.cause = Some("cannot remove '/var/lib/knotless/work/r/s': busy".into());
    store.put(&check).expect("put");
    let state_file = dir.path().join(crate::state::STATE_FILE);
    let mut state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&state_file).expect("state.json")).expect("json");
    state["last_sweep"] = serde_json::json!({
        "at": 1, "removed": ["folder /var/lib/knotless/work/r/s"], "failures": ["cannot remove /tmp/x: busy"]
    });
    std::fs::write(&state_file, serde_json::to_vec(&state).expect("json")).expect("write");
    let token = "0123456789abcdef0123456789abcdef";
    let bearer = format!("Bearer {token}");
    let public = serve(dir.path(), true, Some(token)).await;
    let loopback = serve(dir.path(), false, None).await;
    for path in ["/api/repositories/repo-a/checks", "/api/repositories/repo-a/checks/run-a", "/api/runner", "/runner"] {
        let shown = send(public, "GET", path, &[("Authorization", &bearer)]).await;
        assert_eq!(shown.status, 200, "{path}");
        for host_path in ["/var/lib/knotless", "/tmp/x"] {
            assert!(!shown.body.contains(host_path), "{path}: {}", shown.body);
        }
        assert!(shown.body.contains("PATH"), "{path}: {}", shown.body);
    }
    let page = send(public, "GET", "/repositories/repo-a/checks/run-a", &[("Authorization", &bearer)]).await;
    assert!(
        page.body.contains("cannot remove &#39;PATH&#39;: busy") || page.body.contains("cannot remove 'PATH': busy"),
        "{}",
        page.body
    );
    let shown = get(loopback, "/api/repositories/repo-a/checks/run-a").await;
    assert!(shown.body.contains("/var/lib/knotless/outputs/repo-a/run-a"), "{}", shown.body);
}

#[test]
fn hide_paths_turns_each_absolute_path_into_path() {
    use super::view::hide_paths;
    assert_eq!(hide_paths("cannot remove /a/b: busy"), "cannot remove PATH: busy");
    assert_eq!(hide_paths("folder '/a b/c' gone"), "folder 'PATH b/c' gone");
    assert_eq!(hide_paths("(/x/y), [/z]."), "(PATH), [PATH].");
    assert_eq!(hide_paths("no path here, a/b is relative"), "no path here, a/b is relative");
    assert_eq!(hide_paths("/"), "PATH");
}

/// A damaged record, or one naming another repository, is named on the repository's page and
/// hides none of the others.
#[tokio::test]
async fn a_damaged_record_is_named_on_the_page_and_hides_no_other() {
    let dir = tempfile::tempdir().expect("tempdir");
    state_folder(dir.path());
    let store = CheckStore::new(dir.path());
    std::fs::write(store.record_path("repo-a", "run-damaged"), b"{\"run_id\": ").expect("write");
    let mut stray = record("repo-b", "run-stray", &[]);
    stray.run_id = "run-stray".into();
    std::fs::write(store.record_path("repo-a", "run-<b>stray"), serde_json::to_vec(&stray).expect("json"))
        .expect("write");
    let addr = serve(dir.path(), false, None).await;
    let page = get(addr, "/repositories/repo-a").await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("2 check record(s) of this repository cannot be read"), "{}", page.body);
    assert!(page.body.contains("<code>run-damaged.json</code>"), "{}", page.body);
    assert!(page.body.contains("<code>run-&lt;b&gt;stray.json</code>"), "escaped: {}", page.body);
    assert!(page.body.contains("run-a"), "the readable record is still listed: {}", page.body);
    let clean = get(addr, "/repositories/repo-b").await;
    assert!(!clean.body.contains("cannot be read"), "{}", clean.body);
}

/// The session cookie is `Secure` when the login came through the trusted proxy over HTTPS, and
/// only then: the header alone, from anyone else, does not make it so.
#[tokio::test]
async fn the_session_cookie_is_secure_behind_the_trusted_proxy_over_https() {
    let dir = tempfile::tempdir().expect("tempdir");
    state_folder(dir.path());
    let token = "0123456789abcdef0123456789abcdef";
    let bearer = format!("Bearer {token}");
    let cookie_of = |addr: SocketAddr, proto: Option<&'static str>| {
        let bearer = bearer.clone();
        async move {
            let link = send(addr, "POST", "/login-link", &[("Authorization", &bearer)]).await;
            let path = link.body.trim().to_string();
            let headers: Vec<(&str, &str)> = proto.map(|proto| ("X-Forwarded-Proto", proto)).into_iter().collect();
            let opened = send(addr, "GET", &path, &headers).await;
            assert_eq!(opened.status, 303);
            opened.header("set-cookie").expect("a cookie").to_string()
        }
    };
    let proxied = serve_behind(dir.path(), true, Some(token), Some("127.0.0.1".parse().expect("ip"))).await;
    assert!(cookie_of(proxied, Some("https")).await.ends_with("; Secure"));
    assert!(cookie_of(proxied, Some("HTTPS")).await.ends_with("; Secure"));
    assert!(!cookie_of(proxied, Some("http")).await.contains("Secure"));
    assert!(!cookie_of(proxied, None).await.contains("Secure"));
    let elsewhere = serve_behind(dir.path(), true, Some(token), Some("192.0.2.7".parse().expect("ip"))).await;
    assert!(!cookie_of(elsewhere, Some("https")).await.contains("Secure"), "not from the trusted proxy");
    let direct = serve(dir.path(), true, Some(token)).await;
    assert!(!cookie_of(direct, Some("https")).await.contains("Secure"), "no proxy is trusted");
}

/// The front page and the API list the repositories watched now; one no longer watched keeps
/// its page and its checks at their addresses.
#[tokio::test]
async fn only_repositories_watched_now_are_listed_and_the_others_stay_reachable() {
    let dir = tempfile::tempdir().expect("tempdir");
    state_folder(dir.path());
    let addr = serve(dir.path(), false, None).await;
    let listed = |body: &str, key: &str| body.contains(&format!("\"key\": \"{key}\""));
    let before = get(addr, "/api/repositories").await.body;
    assert!(listed(&before, "repo-a") && listed(&before, "repo-b"), "a state that does not say lists all: {before}");
    let path = dir.path().join("state.json");
    let mut state: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
    state["watched"] = serde_json::json!(["repo-a"]);
    std::fs::write(&path, serde_json::to_vec(&state).expect("json")).expect("write");
    let after = get(addr, "/api/repositories").await.body;
    assert!(listed(&after, "repo-a") && !listed(&after, "repo-b"), "{after}");
    let front = get(addr, "/").await.body;
    assert!(front.contains("/repositories/repo-a") && !front.contains("/repositories/repo-b"), "{front}");
    assert_eq!(get(addr, "/repositories/repo-b").await.status, 200, "still reachable");
    assert_eq!(get(addr, "/repositories/repo-b/checks/run-b").await.status, 200, "its checks too");
}

/// `/metrics` answers the Prometheus text format: on the page, behind its credentials when it is
/// public; on a listener of its own, to anyone, and nothing else there.
#[tokio::test]
async fn the_metrics_are_served_on_the_page_behind_its_credentials_and_alone_on_their_listener() {
    use crate::metrics::tests::{parse, value};

    let dir = tempfile::tempdir().expect("tempdir");
    state_folder(dir.path());
    let metrics = Arc::new(crate::metrics::Metrics::new());
    let mut ended = record("repo-a", "run-metrics", &[]);
    ended.status = RunStatus::Failure;
    ended.duration_ms = Some(1_500);
    metrics.run_ended(&ended);
    metrics.poll_took(Duration::from_millis(20));
    let scraped = |answer: &Answer| {
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(answer.header("content-type"), Some("text/plain; version=0.0.4; charset=utf-8"));
        assert_eq!(answer.header("x-content-type-options"), Some("nosniff"));
        let scrape = parse(&answer.body);
        let failed = value(&scrape, "knotless_runs_total", &[("status", "failure"), ("workflow_trust", "trusted")]);
        assert_eq!(failed, Some(1.0), "{}", answer.body);
        assert_eq!(value(&scrape, "knotless_poll_duration_seconds_count", &[]), Some(1.0), "{}", answer.body);
    };

    let local = "127.0.0.1:0".parse().expect("addr");
    let config = WebConfig { addr: local, public: false, token: None, trusted_proxy: None };
    let view = View::new(dir.path(), summary());
    let page = start_with_metrics(config, view, Limits::default(), Some(Arc::clone(&metrics)), &Stop::default())
        .await
        .expect("start");
    scraped(&get(page, "/metrics").await);

    let token = "0123456789abcdef0123456789abcdef";
    let config = WebConfig { addr: local, public: true, token: Some(token.into()), trusted_proxy: None };
    let view = View::new(dir.path(), summary());
    let public = start_with_metrics(config, view, Limits::default(), Some(Arc::clone(&metrics)), &Stop::default())
        .await
        .expect("start");
    assert_eq!(get(public, "/metrics").await.status, 401, "a public page's metrics need its token");
    scraped(&send(public, "GET", "/metrics", &[("Authorization", &format!("Bearer {token}"))]).await);

    let without = serve(dir.path(), false, None).await;
    assert_eq!(get(without, "/metrics").await.status, 404, "a page given no metrics has none");

    let alone = start_metrics(local, Arc::clone(&metrics), Limits::default(), &Stop::default()).await.expect("start");
    scraped(&get(alone, "/metrics").await);
    for elsewhere in ["/", "/api/runner", "/repositories/repo-a", "/metrics/x"] {
        assert_eq!(get(alone, elsewhere).await.status, 404, "{elsewhere}");
    }
}

/// The repository and check pages show a commit's subject and author from the mirror, escaped;
/// a commit the mirror does not hold shows its hash alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_show_their_subject_and_author() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path();
    let mirror = state.join("mirrors/repo-c.git");
    std::fs::create_dir_all(&mirror).expect("mkdir");
    let git = crate::git::Git::in_folder(&mirror);
    git.run(&["init", "-q", "--bare"]).await.expect("init");
    let tree = git.text(&["mktree"]).await.expect("the empty tree");
    let commit = git
        .output_with(
            &["commit-tree", tree.trim(), "-m", "Fix the <b>parser</b>\u{1b}[31m\n\nThe body."],
            &[
                ("GIT_AUTHOR_NAME", "Ada & co"),
                ("GIT_AUTHOR_EMAIL", "ada@example.com"),
                ("GIT_AUTHOR_DATE", "2020-01-01T00:00:00Z"),
                ("GIT_COMMITTER_NAME", "c"),
                ("GIT_COMMITTER_EMAIL", "c@example.com"),
            ],
        )
        .await
        .expect("commit-tree");
    let commit = String::from_utf8_lossy(&commit.stdout).trim().to_string();
    assert_eq!(commit.len(), 40, "{commit}");
    let store = CheckStore::new(state);
    let mut known = record("repo-c", "run-known", &[]);
    known.target.commit = commit.clone();
    store.put(&known).expect("put");
    let mut unknown = record("repo-c", "run-unknown", &[]);
    unknown.target.commit = "abababababababababababababababababababab".into();
    store.put(&unknown).expect("put");
    let addr = serve(state, false, None).await;
    let page = get(addr, "/repositories/repo-c/checks/run-known").await;
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains("<span class=\"subject\">Fix the &lt;b&gt;parser&lt;/b&gt;\\x1b[31m</span>"),
        "{}",
        page.body
    );
    assert!(page.body.contains("Ada &amp; co, <time title=\"2020-01-01 00:00:00 UTC\">"), "{}", page.body);
    assert!(!page.body.contains("The body."));
    let other = get(addr, "/repositories/repo-c/checks/run-unknown").await;
    assert_eq!(other.status, 200);
    assert!(!other.body.contains("class=\"subject\""), "{}", other.body);
    let api = get(addr, "/api/repositories/repo-c/checks/run-known").await;
    let api: serde_json::Value = serde_json::from_str(&api.body).expect("JSON");
    assert_eq!(api["commit_info"]["subject"], "Fix the <b>parser</b>\u{1b}[31m");
    assert_eq!(api["commit_info"]["authored_at"], 1_577_836_800_000u64);
    let repository = get(addr, "/repositories/repo-c").await;
    assert!(repository.body.contains("Fix the &lt;b&gt;parser&lt;/b&gt;"), "{}", repository.body);
    assert!(repository.body.contains("Ada &amp; co, authored <time"), "{}", repository.body);
}
