//! The status page: a daemon started with `--http 127.0.0.1:0` serves its pages to headless
//! Chromium, which sees the check listed, the output image decoded, the live log grow while a
//! step waits and the page turn into the finished check when the run ends (no reload), a list
//! of checks refresh itself while one runs, a step's
//! terminal colours drawn, a failed step's last lines first with links into the log, a step
//! named `<script>` as text, and every page fit 400 px; and a page open to the network without
//! a token is refused at start. Screenshots go to `target/status-page/`.

use std::path::PathBuf;

use knotless_tests::browser::{Browser, png};
use knotless_tests::{Repo, Runner, bin_dir, eventually};

use crate::flags;
use crate::queue::{queue_repo, settled, three_fates};

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
    let last = dir.path().join("last");
    let workflow = format!(
        "steps:\n  - name: draw\n    run: cp plot.png \"$KNOTLESS_RUN_OUTPUTS/plot.png\" && \
         printf 'notes <b>bold</b>\\n' > \"$KNOTLESS_RUN_OUTPUTS/notes.txt\" && \
         printf '\\033[32mgreen\\033[0m and \\033[1;31mbold red\\033[0m\\n'\n  \
         - name: \"<script>alert(1)</script>\"\n    run: |\n      \
         while [ ! -e '{go}' ]; do sleep 0.05; done\n      seq 1 60 | sed 's/^/row /'\n      echo first-line\n      \
         printf '\\033[35mviolet\\033[0m\\n'\n      \
         while [ ! -e '{proceed}' ]; do sleep 0.05; done\n      echo second-line\n  \
         - name: last\n    run: while [ ! -e '{last}' ]; do sleep 0.05; done; echo third-line\n",
        go = go.display(),
        proceed = proceed.display(),
        last = last.display()
    );
    let repo = Repo::init(&dir.path().join("repo"));
    repo.workflow("page", &workflow);
    repo.workflow("broken", BROKEN);
    let finish = dir.path().join("finish");
    repo.workflow(
        "slow",
        &format!("steps:\n  - name: wait\n    run: while [ ! -e '{}' ]; do sleep 0.05; done\n", finish.display()),
    );
    std::fs::write(repo.path().join("plot.png"), picture()).expect("write the picture");
    let commit = repo.commit("a workflow that draws");
    let runner = Runner::start(
        &dir.path().join("state"),
        &[flags("e2e-page", &["--http", "127.0.0.1:0"]), vec![repo.url().as_str()]].concat(),
    );
    let base = runner.http_base();
    let running = eventually("a running check", || {
        let checks = runner.checks(&repo.url(), Some(&commit)).into_iter();
        checks.filter(|check| check["workflow"] == "page").find(|check| check["status"] == "running")
    });
    let run_id = running["run_id"].as_str().expect("a run id").to_string();
    let key = running["repository_key"].as_str().expect("a repository key").to_string();
    let check_url = format!("{base}repositories/{key}/checks/{run_id}");
    let shots = screenshots();

    let mut browser = Browser::launch(1100, 900);
    browser.before_each_document("window.__alerts = []; window.alert = (text) => window.__alerts.push(String(text));");
    // A list with a check not ended refreshes itself, without a reload, until all ended.
    browser.open(&format!("{base}repositories/{key}"));
    browser.eval("window.__same_page = true");
    let slow_row =
        "Array.from(document.querySelectorAll('table.checks tr')).find((row) => row.textContent.includes('slow'))";
    assert_eq!(browser.eval(&format!("{slow_row}.querySelector('.status').textContent")), "running");
    std::fs::write(&finish, "").expect("let the slow check end");
    browser.wait_for(
        "the list to show the slow check ended",
        &format!("{slow_row}.querySelector('.status').textContent === 'success'"),
    );
    assert_eq!(browser.eval("window.__same_page"), true, "the page was not reloaded");
    browser.open(&check_url);
    browser.eval("window.__same_page = true");
    assert_eq!(browser.eval("alert('probe'); window.__alerts.splice(0).length"), 1, "alerts are recorded");
    let log = "document.getElementById('log').textContent";
    assert!(
        !browser.eval(log).as_str().expect("the log").contains("first-line"),
        "the step waits before its first line"
    );
    // The steps so far: the first ended, the second running, its section open.
    let rows = "Array.from(document.querySelectorAll('#steps tr')).map((row) => Array.from(row.cells).slice(0, 2).map((cell) => cell.textContent).join(' '))";
    browser.wait_for(
        "the running step in the table",
        &format!("{rows}.join('|') === 'draw success|<script>alert(1)</script> running'"),
    );
    assert_eq!(browser.eval("document.querySelector('#log details.step[data-step=\"1\"]').open"), true);
    // A reader at the bottom of the page follows the lines as they come.
    browser.eval("window.scrollTo(0, document.scrollingElement.scrollHeight)");
    std::fs::write(&go, "").expect("let the step print its first lines");
    browser.wait_for("the first line to stream in", &format!("{log}.includes('first-line')"));
    // Streamed lines are drawn as the finished log's are: coloured, numbered, in their step.
    browser.wait_for("the coloured line", "document.querySelector('#log span.f5')?.textContent === 'violet'");
    assert_eq!(
        browser.eval("document.querySelector('#log span.f5').closest('details').dataset.step"),
        "1",
        "the line is in its step's section"
    );
    let numbered = browser.eval("(() => { const line = document.querySelector('#log span.f5').closest('.line'); return line.id === 'L' + line.querySelector('a.ln').textContent; })()");
    assert_eq!(numbered, true);
    assert!(!browser.eval(log).as_str().expect("the log").contains("second-line"), "the step still waits");
    let bottom = "(() => { const page = document.scrollingElement; return [page.scrollTop, page.scrollHeight - page.scrollTop - page.clientHeight]; })()";
    let at = browser.eval(bottom);
    assert!(at[0].as_f64().is_some_and(|top| top > 0.0), "the page grew below the window: {at}");
    assert!(at[1].as_f64().is_some_and(|below| below <= 24.0), "it followed the new lines: {at}");
    browser.screenshot(&shots.join("running.png"));
    // A reader who scrolled up stays where they are while lines come.
    browser.eval("window.scrollTo(0, 0)");
    // The next step appears as it starts, and the one before shows how it ended.
    std::fs::write(&proceed, "").expect("let the step end");
    browser.wait_for(
        "the next step to start",
        &format!("{rows}.join('|') === 'draw success|<script>alert(1)</script> success|last running'"),
    );
    assert_eq!(
        browser.eval("document.querySelector('#log details.step[data-step=\"2\"] .status').textContent"),
        "running"
    );
    assert_eq!(
        browser.eval("document.querySelector('#log details.step[data-step=\"1\"] .status').textContent"),
        "success"
    );
    assert_eq!(browser.eval("document.querySelector('h1 .status').textContent"), "running");
    browser.wait_for("the second step's last line", &format!("{log}.includes('second-line')"));
    assert_eq!(browser.eval("document.scrollingElement.scrollTop"), 0, "the reader stayed at the top");
    std::fs::write(&last, "").expect("let the last step end");
    let ended = browser.wait_for("the page to turn into the finished check", "document.body.dataset.ended");
    assert_eq!(ended, "success");
    // No reload: the badge, the steps and the log are the finished check's.
    assert_eq!(browser.eval("window.__same_page"), true, "the page was not reloaded");
    assert_eq!(browser.eval("document.querySelector('h1 .status').textContent"), "success");
    assert_eq!(browser.eval("document.querySelectorAll('td.step').length"), 3);
    assert!(browser.eval(log).as_str().expect("the log").contains("third-line"), "the rest streamed in");
    assert_eq!(browser.eval("document.getElementById('live-state')"), serde_json::Value::Null);

    let checks = runner.final_checks(&repo.url(), &commit, 3);
    let page = checks.iter().find(|check| check["workflow"] == "page").expect("the page check");
    assert_eq!(page["status"], "success", "{checks:#?}");
    browser.open(&check_url);
    let width = browser.eval("(() => { const image = document.querySelector('img.output'); return image && image.complete ? image.naturalWidth : 0; })()");
    assert_eq!(width, WIDTH, "the PNG output is decoded at its natural width");
    let steps = browser.eval("Array.from(document.querySelectorAll('td.step')).map((cell) => cell.textContent)");
    assert_eq!(steps, serde_json::json!(["draw", "<script>alert(1)</script>", "last"]));
    assert_eq!(browser.eval("document.querySelectorAll('script').length"), 0, "a finished check's page runs no script");
    assert_eq!(browser.eval("window.__alerts.length"), 0);
    let preview = browser.eval("document.querySelector('pre.preview').textContent");
    assert_eq!(preview, "notes <b>bold</b>\n", "a text output is previewed as text");
    // The commit as its author wrote it.
    assert_eq!(browser.eval("document.querySelector('.facts .subject').textContent"), "a workflow that draws");
    // Terminal colours are drawn, and no escape is left in the log.
    assert_eq!(browser.eval("document.querySelector('#log span.f2').textContent"), "green");
    assert_eq!(browser.eval("document.querySelector('#log span.b.f1').textContent"), "bold red");
    let text = browser.eval(log);
    assert!(text.as_str().is_some_and(|text| !text.contains('\u{1b}') && !text.contains("\\x1b")), "{text}");
    // The passing steps' sections are closed.
    assert_eq!(browser.eval("document.querySelectorAll('#log details.step[open]').length"), 0);
    browser.screenshot(&shots.join("check.png"));

    // A failed check: the failed step's last lines first, linked to the log's.
    let broken = checks.iter().find(|check| check["workflow"] == "broken").expect("the broken check");
    assert_eq!(broken["status"], "failure");
    let broken_url = format!("{base}repositories/{key}/checks/{}", broken["run_id"].as_str().expect("a run id"));
    browser.open(&broken_url);
    let tail =
        browser.eval("Array.from(document.querySelectorAll('.failure .line .tx')).map((line) => line.textContent)");
    let tail: Vec<&str> = tail.as_array().expect("the tail").iter().filter_map(|line| line.as_str()).collect();
    // The last 20 of its 31 lines, in order.
    assert_eq!(tail.len(), 20, "{tail:?}");
    assert_eq!((tail[0], tail[18], tail[19]), ("line 12", "line 30", "error: boom"), "{tail:?}");
    assert_eq!(
        browser.eval("document.querySelector('.failure').compareDocumentPosition(document.getElementById('log')) & Node.DOCUMENT_POSITION_FOLLOWING"),
        4,
        "the tail comes before the log"
    );
    assert_eq!(
        browser.eval("document.querySelectorAll('#log details.step[open]').length"),
        1,
        "the failed step is open"
    );
    let href = browser.eval("document.querySelector('.failure .line:last-child a.ln').getAttribute('href')");
    let anchor = href.as_str().expect("a link").to_string();
    assert!(anchor.starts_with("#L"), "{anchor}");
    browser.eval("document.querySelector('.failure .line:last-child a.ln').click()");
    assert_eq!(browser.eval("location.hash"), anchor.as_str(), "a click puts the line in the address bar");
    let line = format!("document.getElementById('{}')", &anchor[1..]);
    assert_eq!(browser.eval(&format!("{line}.matches(':target')")), true);
    assert_eq!(browser.eval(&format!("{line}.textContent.includes('error: boom')")), true);
    let icon = browser.eval("fetch(document.querySelector('link[rel=icon]').href).then((response) => response.status)");
    assert_eq!(icon, 200, "the page's icon is there");
    assert_eq!(browser.eval("fetch('/favicon.ico').then((response) => response.status)"), 200);
    // Opened at the address of a line of a closed step, the page shows that line.
    browser.open(&format!("{broken_url}#L5"));
    let seen = browser.eval("(() => { const r = document.getElementById('L5').getBoundingClientRect(); return r.height > 0 && r.top >= 0 && r.bottom <= innerHeight; })()");
    assert_eq!(seen, true, "line 5 is in view");
    browser.screenshot(&shots.join("failed.png"));

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
    // The shell executor's own version, as its --version says it: `knotless-executor-shell V (protocol 1)`.
    let said = std::process::Command::new(bin_dir().join("knotless-executor-shell")).arg("--version").output();
    let said = String::from_utf8(said.expect("--version").stdout).expect("UTF-8");
    let version = said.split_whitespace().nth(1).expect("a version");
    assert!(
        text.as_str()
            .is_some_and(|text| text.contains(&format!("shell {version}")) && text.contains("Last orphan sweep")),
        "{text}"
    );
    browser.screenshot(&shots.join("runner.png"));
    assert_eq!(browser.eval("window.__alerts.length"), 0);

    // Every page fits a 400 px screen: nothing scrolls sideways.
    browser.resize(400, 800);
    for (page, shot) in [
        (check_url.as_str(), Some("narrow-check.png")),
        (broken_url.as_str(), None),
        (&format!("{base}repositories/{key}"), Some("narrow-repository.png")),
        (base.as_str(), None),
        (&format!("{base}runner"), None),
    ] {
        browser.open(page);
        let widths = browser.eval("[document.documentElement.scrollWidth, document.documentElement.clientWidth]");
        let (scroll, client) = (widths[0].as_u64().expect("a width"), widths[1].as_u64().expect("a width"));
        assert!(scroll <= client, "{page} is {scroll} px wide in a {client} px window");
        if let Some(shot) = shot {
            browser.screenshot(&shots.join(shot));
        }
    }
    assert_eq!(browser.eval("window.__alerts.length"), 0);
}

/// A step that prints 30 lines, then an error in colour, all on stderr (one stream keeps its
/// order), and fails.
const BROKEN: &str = "steps:\n  - name: build\n    run: echo built\n  - name: test\n    run: |\n      \
    for n in $(seq 1 30); do echo \"line $n\" >&2; done\n      \
    printf '\\033[1;31merror\\033[0m: boom\\n' >&2\n      exit 1\n";

/// A branch's merge queue, with pulls ejected for a failed pre-flight and a conflict and one
/// landed, fits a 400 px screen, its entries stacked with their columns named.
#[test]
fn the_queue_page_fits_a_narrow_screen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, base) = queue_repo(dir.path(), None);
    three_fates(&repo, &base);
    let url = repo.url();
    let extra = ["--queue", "--force-shell", "--http", "127.0.0.1:0"];
    let runner = Runner::start(&dir.path().join("state"), &[flags("e2e-page-queue", &extra), vec![&url]].concat());
    let queue = settled(&runner, &url, 3);
    let key = runner.checks(&url, None).first().and_then(|check| check["repository_key"].as_str().map(str::to_string));
    let page = format!("{}repositories/{}/queue/main", runner.http_base(), key.expect("a repository key"));
    let mut browser = Browser::launch(1100, 900);
    browser.open(&page);
    let text = browser.eval("document.body.innerText");
    let text = text.as_str().expect("the page's text");
    assert!(text.contains("pre-flight pre failed") && text.contains("conflicts with main"), "{text}\n{queue:#}");
    browser.screenshot(&screenshots().join("queue.png"));
    browser.resize(400, 800);
    browser.open(&page);
    let widths = browser.eval("[document.documentElement.scrollWidth, document.documentElement.clientWidth]");
    let (scroll, client) = (widths[0].as_u64().expect("a width"), widths[1].as_u64().expect("a width"));
    assert!(scroll <= client, "the queue page is {scroll} px wide in a {client} px window");
    let label =
        browser.eval("getComputedStyle(document.querySelector('table.queue td[data-label]'), '::before').content");
    assert_eq!(label, "\"head: \"", "a stacked cell is named by its column");
    browser.screenshot(&screenshots().join("narrow-queue.png"));
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
