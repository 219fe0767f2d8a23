//! The page's live log over a real socket, its stop, and the connections that would hold it
//! open.

use super::*;

/// Reads from `stream` until what was read contains `needle` (or the deadline passes).
async fn read_until(stream: &mut tokio::net::TcpStream, read: &mut String, needle: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut buffer = [0u8; 4096];
    while !read.contains(needle) {
        let left = deadline.checked_duration_since(std::time::Instant::now()).expect("in time");
        let count = tokio::time::timeout(left, stream.read(&mut buffer)).await.expect("in time").expect("read");
        assert!(count > 0, "the stream closed before {needle:?}: {read}");
        read.push_str(&String::from_utf8_lossy(&buffer[..count]));
    }
}

async fn open_stream(addr: SocketAddr, path: &str, last_event: Option<&str>) -> tokio::net::TcpStream {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let resume = last_event.map(|id| format!("Last-Event-ID: {id}\r\n")).unwrap_or_default();
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{resume}\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    stream
}

#[tokio::test]
async fn the_live_log_streams_whole_lines_drawn_and_the_steps_as_they_go_and_ends_with_the_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    state_folder(dir.path());
    let store = CheckStore::new(dir.path());
    let mut running = record("repo-a", "run-live", &[]);
    running.status = RunStatus::Running;
    running.steps = vec![
        StepReport {
            name: "b".into(),
            status: StepStatus::Success,
            exit_code: Some(0),
            duration_ms: 1200,
            reason: None,
        },
        StepReport { name: "s".into(), status: StepStatus::Skipped, exit_code: None, duration_ms: 0, reason: None },
    ];
    running.running_step = Some(1);
    store.put(&running).expect("put");
    let log = store.log_path("repo-a", "run-live");
    // 17 + 7 + 17 + 8 bytes of whole lines, then a line not yet whole.
    let head = "==> step b (1/2)\n[b] ok\n==> step s (2/2)\n[s] one\n";
    std::fs::write(&log, format!("{head}[s] tw")).expect("log");
    let addr = serve(dir.path(), false, None).await;
    let page = get(addr, "/repositories/repo-a/checks/run-live").await;
    assert!(
        page.body.contains(r#"data-live="/repositories/repo-a/checks/run-live/log/live?from=49""#),
        "{}",
        page.body
    );
    assert!(page.body.contains(r#"<script src="/static/page.js">"#), "{}", page.body);
    // The page draws the log so far in sections, the running step's open.
    assert!(page.body.contains(r#"<details class="section step" data-step="0"><summary><span class="step">b</span> <span class="status ok">success</span>"#), "{}", page.body);
    assert!(page.body.contains(r#"<details class="section step" open data-step="1"><summary><span class="step">s</span> <span class="status live">running</span>"#), "{}", page.body);
    assert!(page.body.contains(r#"<tbody id="steps"><tr><td class="step">b</td><td><span class="status ok">success</span></td><td>0</td><td>1.2 s</td></tr><tr><td class="step">s</td><td><span class="status live">running</span></td><td></td><td></td></tr></tbody>"#), "{}", page.body);
    assert!(page.body.contains(r#"id="L4""#) && !page.body.contains(r#"id="L5""#), "{}", page.body);

    let path = "/repositories/repo-a/checks/run-live/log/live?from=0";
    let mut stream = open_stream(addr, path, None).await;
    let mut read = String::new();
    read_until(&mut stream, &mut read, r#"{"n":4,"c":"line","s":[["","one"]]}"#).await;
    assert!(read.contains("content-type: text/event-stream") && read.contains("id: 49"), "{read}");
    assert!(read.contains(r#"{"n":3,"c":"line note","s":[["","==> step s (2/2)"]],"step":["s",1]}"#), "{read}");
    assert!(
        read.contains(r#"event: steps"#)
            && read.contains(r#"{"name":"s","status":"running","class":"live","reason":null,"exit":"","time":""}"#),
        "{read}"
    );
    assert!(!read.contains("tw"), "only whole lines: {read}");
    std::fs::write(&log, format!("{head}[s] two \u{1b}[1m<b>\n[s!] bad\n")).expect("log");
    read_until(&mut stream, &mut read, r#"{"n":5,"c":"line","s":[["","two "],["b","<b>"]]}"#).await;
    read_until(&mut stream, &mut read, r#"{"n":6,"c":"line err","s":[["","bad"]]}"#).await;
    running.status = RunStatus::Failure;
    running.steps[1] =
        StepReport { status: StepStatus::Failure, exit_code: Some(1), duration_ms: 30, ..running.steps[1].clone() };
    running.running_step = None;
    store.put_log("repo-a", "run-live", &format!("{head}[s] two \u{1b}[1m<b>\n[s!] bad\n==> failure\n")).expect("log");
    store.put(&running).expect("put");
    read_until(&mut stream, &mut read, "event: end").await;
    read_until(&mut stream, &mut read, "\"failure\"").await;
    assert!(read.contains(r#"{"n":7,"c":"line note","s":[["","==> failure"]]}"#), "{read}");
    // A browser that reconnects goes on from the last event it had, numbered as before.
    let mut resumed = open_stream(addr, path, Some("49")).await;
    let mut again = String::new();
    read_until(&mut resumed, &mut again, "event: end").await;
    assert!(
        !again.contains(r#""n":4"#) && again.contains(r#"{"n":5,"c":"line","s":[["","two "],["b","<b>"]]}"#),
        "{again}"
    );
}

/// A stopping page ends its live logs (whose runs go on), lets the connections end, and takes
/// no new one.
#[tokio::test]
async fn a_stop_ends_the_live_logs_and_takes_no_new_connection() {
    let dir = tempfile::tempdir().expect("tempdir");
    state_folder(dir.path());
    let store = CheckStore::new(dir.path());
    let mut running = record("repo-a", "run-live", &[]);
    running.status = RunStatus::Running;
    store.put(&running).expect("put");
    std::fs::write(store.log_path("repo-a", "run-live"), "==> step s (1/1)\n[s] one\n").expect("log");
    let config =
        WebConfig { addr: "127.0.0.1:0".parse().expect("addr"), public: false, token: None, trusted_proxy: None };
    let stop = Stop::default();
    let addr = start_with_metrics(config, View::new(dir.path(), summary()), Limits::default(), None, &stop)
        .await
        .expect("start");
    let mut stream = open_stream(addr, "/repositories/repo-a/checks/run-live/log/live?from=0", None).await;
    let mut read = String::new();
    read_until(&mut stream, &mut read, "one").await;
    assert!(stop.stop(Duration::from_secs(10)).await, "the live log's connection did not end");
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest)).await;
    assert!(matches!(ended, Ok(Ok(_))), "the stream was not ended: {ended:?}");
    assert!(!String::from_utf8_lossy(&rest).contains("event: end"), "the run did not end; the stream did");
    // Its listener goes with its accepting loop, which the stop ended.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        assert!(std::time::Instant::now() < deadline, "a stopped page still takes connections");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Connections that send nothing, or a header line at a time, are closed at the header timeout,
/// and so is one left idle after a response; the page keeps answering others meanwhile, and
/// never serves more connections at once than its cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_hold_the_page_open_are_closed_and_capped() {
    let dir = tempfile::tempdir().expect("tempdir");
    state_folder(dir.path());
    let config =
        WebConfig { addr: "127.0.0.1:0".parse().expect("addr"), public: false, token: None, trusted_proxy: None };
    let limits = Limits { header_timeout: Duration::from_millis(1500), max_connections: 220 };
    let addr = start_with(config, View::new(dir.path(), summary()), limits).await.expect("start");
    let opened = std::time::Instant::now();
    let mut silent = Vec::new();
    for _ in 0..200 {
        silent.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
    }
    // One that dribbles a header line every 300 ms, for ever.
    let dribbling = tokio::spawn(async move {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        stream.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.expect("write");
        let started = std::time::Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            if stream.write_all(b"X-Slow: 1\r\n").await.is_err() || started.elapsed() > Duration::from_secs(30) {
                return started.elapsed();
            }
        }
    });
    // One kept alive after its answer, and then left idle.
    let mut idle = tokio::net::TcpStream::connect(addr).await.expect("connect");
    idle.write_all(b"GET /api/runner HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
    // Served meanwhile.
    assert_eq!(get(addr, "/").await.status, 200);
    for mut stream in silent.into_iter().chain([idle]) {
        let mut sink = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut sink)).await;
        assert!(read.is_ok(), "a connection was still open {} ms after it opened", opened.elapsed().as_millis());
    }
    let closed_after = opened.elapsed();
    assert!(closed_after >= Duration::from_millis(1400), "closed before the timeout: {closed_after:?}");
    let dribbled = dribbling.await.expect("the dribbler");
    assert!(dribbled < Duration::from_secs(10), "a connection dribbling headers stayed {dribbled:?}");
    assert_eq!(get(addr, "/").await.status, 200, "the page still answers");

    // The cap: with every slot held by a silent connection, the next waits to be accepted,
    // and is answered once a slot frees.
    let mut held = Vec::new();
    for _ in 0..220 {
        held.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
    }
    let waiting = tokio::spawn(async move { get(addr, "/").await.status });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "answered past the cap of 220 connections");
    drop(held);
    let status = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("answered").expect("task");
    assert_eq!(status, 200);
}
