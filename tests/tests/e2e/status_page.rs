//! The status page: a daemon started with `--http 127.0.0.1:0` serves its pages to headless
//! Chromium, which sees the check listed, the output image decoded, the live log grow while a
//! step waits and end with the run, and a step named `<script>` as text; and a page open to the
//! network without a token is refused at start. Screenshots go to `target/status-page/`.

use std::path::PathBuf;

use knotless_tests::browser::{Browser, png};
use knotless_tests::{Repo, Runner, bin_dir, eventually};

use crate::flags;

const WIDTH: u32 = 160;
const HEIGHT: u32 = 48;

/// Where the screenshots go: `target/status-page/`, for a person to look at.
fn screenshots() -> PathBuf {
    bin_dir().parent().expect("the target folder").join("status-page")
}

/// A plot-like picture: a gradient with bars.
fn picture() -> Vec<u8> {
    png(WIDTH, HEIGHT, |x, y| {
        let bar = (x / 20) % 2 == 0 && y > HEIGHT - 1 - (x * 37 % 40);
        if bar { [46, 125, 50] } else { [230, 240 - (y * 2) as u8, 255 - (x / 2) as u8] }
    })
}

#[test]
fn the_status_page_shows_the_check_its_image_and_its_live_log_in_a_browser() {
    let dir = tempfile::tempdir().expect("tempdir");
    let go = dir.path().join("go");
    let proceed = dir.path().join("proceed");
    let workflow = format!(
        "steps:\n  - name: draw\n    run: cp plot.png \"$KNOTLESS_RUN_OUTPUTS/plot.png\" && \
         printf 'notes <b>bold</b>\\n' > \"$KNOTLESS_RUN_OUTPUTS/notes.txt\"\n  \
         - name: \"<script>alert(1)</script>\"\n    run: |\n      \
         while [ ! -e '{go}' ]; do sleep 0.05; done\n      echo first-line\n      \
         while [ ! -e '{proceed}' ]; do sleep 0.05; done\n      echo second-line\n",
        go = go.display(),
        proceed = proceed.display()
    );
    let repo = Repo::init(&dir.path().join("repo"));
    repo.workflow("page", &workflow);
    std::fs::write(repo.path().join("plot.png"), picture()).expect("write the picture");
    let commit = repo.commit("a workflow that draws");
    let runner = Runner::start(
        &dir.path().join("state"),
        &[flags("e2e-page", &["--http", "127.0.0.1:0"]), vec![repo.url().as_str()]].concat(),
    );
    let base = runner.http_base();
    let running = eventually("a running check", || {
        runner.checks(&repo.url(), Some(&commit)).into_iter().find(|check| check["status"] == "running")
    });
    let run_id = running["run_id"].as_str().expect("a run id").to_string();
    let key = running["repository_key"].as_str().expect("a repository key").to_string();
    let check_url = format!("{base}repositories/{key}/checks/{run_id}");
    let shots = screenshots();

    let mut browser = Browser::launch(1100, 900);
    browser.before_each_document("window.__alerts = []; window.alert = (text) => window.__alerts.push(String(text));");
    browser.open(&check_url);
    assert_eq!(browser.eval("alert('probe'); window.__alerts.splice(0).length"), 1, "alerts are recorded");
    let log = "document.getElementById('log').textContent";
    assert!(
        !browser.eval(log).as_str().expect("the log").contains("first-line"),
        "the step waits before its first line"
    );
    std::fs::write(&go, "").expect("let the step print its first line");
    browser.wait_for("the first line to stream in", &format!("{log}.includes('first-line')"));
    assert!(!browser.eval(log).as_str().expect("the log").contains("second-line"), "the step still waits");
    browser.screenshot(&shots.join("running.png"));
    std::fs::write(&proceed, "").expect("let the step end");
    let ended = browser.wait_for("the stream to end with the run", "document.getElementById('log').dataset.ended");
    assert_eq!(ended, "success");
    assert!(browser.eval(log).as_str().expect("the log").contains("second-line"), "the rest streamed in");
    assert!(
        browser
            .eval("document.getElementById('live-state').textContent")
            .as_str()
            .is_some_and(|text| text.contains("ended"))
    );

    let checks = runner.final_checks(&repo.url(), &commit, 1);
    assert_eq!(checks[0]["status"], "success", "{checks:#?}");
    browser.open(&check_url);
    let width = browser.eval("(() => { const image = document.querySelector('img.output'); return image && image.complete ? image.naturalWidth : 0; })()");
    assert_eq!(width, WIDTH, "the PNG output is decoded at its natural width");
    let steps = browser.eval("Array.from(document.querySelectorAll('td.step')).map((cell) => cell.textContent)");
    assert_eq!(steps, serde_json::json!(["draw", "<script>alert(1)</script>"]));
    assert_eq!(browser.eval("document.querySelectorAll('script').length"), 0, "a finished check's page runs no script");
    assert_eq!(browser.eval("window.__alerts.length"), 0);
    let preview = browser.eval("document.querySelector('pre.preview').textContent");
    assert_eq!(preview, "notes <b>bold</b>\n", "a text output is previewed as text");
    browser.screenshot(&shots.join("check.png"));

    browser.open(&format!("{base}repositories/{key}"));
    let listed = browser.eval(&format!("document.querySelectorAll('a[href$=\"/checks/{run_id}\"]').length"));
    assert!(listed.as_u64().is_some_and(|count| count >= 1), "the repository page lists the check");
    let text = browser.eval("document.body.innerText");
    assert!(
        text.as_str()
            .is_some_and(|text| text.contains("page") && text.contains("success") && text.contains("e2e-page")),
        "{text}"
    );
    browser.screenshot(&shots.join("repository.png"));
    browser.open(&base);
    assert!(browser.eval("document.body.innerText").as_str().is_some_and(|text| text.contains("/repo")));
    browser.open(&format!("{base}runner"));
    let text = browser.eval("document.body.innerText");
    assert!(
        text.as_str().is_some_and(|text| text.contains("shell 0.1.0") && text.contains("Last orphan sweep")),
        "{text}"
    );
    browser.screenshot(&shots.join("runner.png"));
    assert_eq!(browser.eval("window.__alerts.length"), 0);
}

#[test]
fn a_status_page_open_to_the_network_without_a_token_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::init(&dir.path().join("repo"));
    repo.workflow("pass", "steps:\n  - name: s\n    run: 'true'\n");
    repo.commit("a workflow");
    for (extra, needs) in [
        (vec!["--http", "0.0.0.0:0"], "--http-public"),
        (vec!["--http", "0.0.0.0:0", "--http-public"], "KNOTLESS_HTTP_TOKEN"),
    ] {
        let state = dir.path().join(format!("state-{}", extra.len()));
        let mut runner =
            Runner::start(&state, &[flags("e2e-page-refused", &extra), vec![repo.url().as_str()]].concat());
        let status = runner.wait();
        assert_eq!(status.code(), Some(2), "{extra:?}: {}", runner.stderr());
        let stderr = runner.stderr();
        assert!(stderr.contains(needs) && !stderr.contains("status page at"), "{extra:?}: {stderr}");
        assert!(!state.join("checks").exists(), "{extra:?}: nothing ran: {stderr}");
    }
}
