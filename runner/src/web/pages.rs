//! The pages, as maud templates: every value is escaped by the template, and every name, cause
//! and log line is also shown with its control characters escaped (`\x1b`), as the terminal
//! commands show them. No page needs JavaScript: the live log's stream, and the refresh of a
//! list of checks while one runs, are the scripts.

use std::collections::HashMap;

use maud::{DOCTYPE, Markup, html};

use super::format;
use super::outputs::Kind;
use super::view::{CommitInfo, RepositoryView, RunnerNow};
use crate::checks::CheckRecord;
use crate::printable;
use crate::queue::QueueState;

/// How many commits the repository page lists under "recent commits".
pub const RECENT_COMMITS: usize = 30;

/// How often a list of checks with one not ended refreshes itself.
const REFRESH_SECONDS: u64 = 3;

/// A repository's page address.
pub fn repository_href(key: &str) -> String {
    format!("/repositories/{key}")
}

/// A check's page address.
pub fn check_href(record: &CheckRecord) -> String {
    format!("/repositories/{}/checks/{}", record.repository_key, record.run_id)
}

/// The page address of run `run_id` of the repository of `record`.
pub fn run_href(record: &CheckRecord, run_id: &str) -> String {
    format!("/repositories/{}/checks/{}", record.repository_key, path_escape(run_id))
}

/// A merge queue's page address (the branch's characters escaped for a URL path).
pub fn queue_href(key: &str, branch: &str) -> String {
    format!("/repositories/{key}/queue/{}", path_escape(branch))
}

/// An output's address.
pub fn output_href(record: &CheckRecord, path: &str) -> String {
    format!("{}/outputs/{}", check_href(record), path_escape(path))
}

/// Percent-escapes all but unreserved characters and `/`.
pub fn path_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~/".contains(&byte) {
            escaped.push(byte as char);
        } else {
            escaped.push_str(&format!("%{byte:02X}"));
        }
    }
    escaped
}

/// A name as shown: control characters escaped.
fn name(text: &str) -> String {
    printable::name(text).into_owned()
}

/// The frame of every page.
fn layout(title: &str, body: Markup) -> Markup {
    frame(title, body, false)
}

/// The frame of a list of checks: while one of them has not ended (`live`), the page fetches
/// itself every few seconds and puts the new list in place (`page.js`).
fn frame(title: &str, body: Markup, live: bool) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (name(title)) " · knotless-run" }
                link rel="stylesheet" href="/static/style.css";
                link rel="icon" type="image/svg+xml" href="/static/favicon.svg";
            }
            body {
                header {
                    nav { a href="/" { "knotless-run" } " " a href="/runner" { "runner" } }
                }
                main data-refresh=[live.then_some(REFRESH_SECONDS)] { (body) }
                @if live { script src="/static/page.js" {} }
            }
        }
    }
}

/// A time as people say it (`3 minutes ago`), the UTC time on hover.
fn when(ms: u64, now_ms: u64) -> Markup {
    html! { time title=(format::time(ms)) { (format::ago(ms, now_ms)) } }
}

/// A commit's subject, then its author and when they wrote it.
fn commit_line(commit: &CommitInfo, now_ms: u64) -> Markup {
    html! {
        span.subject { (name(&commit.subject)) }
        br;
        span.meta { (name(&commit.author)) ", " (when(commit.authored_ms, now_ms)) }
    }
}

/// The class a status word is drawn in.
pub fn status_class(word: &str) -> &'static str {
    match word {
        "success" | "passed" | "landed" | "merged" => "ok",
        "failure" | "error" | "failed" | "ejected" | "timed out" => "bad",
        "running" | "in batch" | "in-batch" => "live",
        _ => "idle",
    }
}

/// A status by colour and word.
pub fn status(word: &str) -> Markup {
    html! { span class={ "status " (status_class(word)) } { (word) } }
}

/// A row of a check's steps, as its page and its live log's stream show it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StepRow {
    pub name: String,
    pub status: &'static str,
    pub class: &'static str,
    pub reason: Option<String>,
    pub exit: String,
    pub time: String,
}

/// The rows of a check's steps: while it runs, those that ended or were skipped and the one
/// running.
pub fn step_rows(record: &CheckRecord) -> Vec<StepRow> {
    let running = record.running_step.filter(|_| !record.status.is_final());
    record
        .steps
        .iter()
        .enumerate()
        .map(|(at, step)| {
            let word = if running == Some(at) { "running" } else { step.status.as_str() };
            let ended = running != Some(at);
            StepRow {
                name: printable::name(&step.name).into_owned(),
                status: word,
                class: status_class(word),
                reason: step.reason.as_deref().filter(|_| ended).map(|reason| printable::name(reason).into_owned()),
                exit: match step.exit_code {
                    Some(code) => code.to_string(),
                    None if ended => "none".to_string(),
                    None => String::new(),
                },
                time: if ended { format::duration(step.duration_ms) } else { String::new() },
            }
        })
        .collect()
}

/// A row per check: workflow, status, duration, runner, trust.
fn checks_table(records: &[&CheckRecord], now_ms: u64) -> Markup {
    html! {
        table.checks {
            thead { tr { th { "workflow" } th { "status" } th { "duration" } th { "runner" } th { "trust" } th { "on" } } }
            tbody {
                @for record in records {
                    tr {
                        td { a href=(check_href(record)) { (name(&record.workflow)) } }
                        td { (status(record.status.as_str())) }
                        td { (format::check_duration(record, now_ms)) }
                        td { (name(&record.runner_id)) }
                        td { (format::trust(record)) }
                        td { (name(&format::target(record))) }
                    }
                }
            }
        }
    }
}

/// Badges for a commit's checks, each linking to its check.
fn badges(records: &[&CheckRecord]) -> Markup {
    html! {
        @if records.is_empty() { span.none { "no checks" } }
        @for record in records {
            a.badge href=(check_href(record)) { (name(&record.workflow)) " " (status(record.status.as_str())) }
            " "
        }
    }
}

/// The latest check of each workflow among `records` (oldest first in, in workflow order out).
fn latest_per_workflow<'a>(records: &[&'a CheckRecord]) -> Vec<&'a CheckRecord> {
    let mut latest: Vec<&CheckRecord> = Vec::new();
    for record in records {
        match latest.iter_mut().find(|known| known.workflow == record.workflow) {
            Some(known) => *known = record,
            None => latest.push(record),
        }
    }
    latest.sort_by(|a, b| a.workflow.cmp(&b.workflow));
    latest
}

/// The home page: the runner in a line, and each repository with its branches' checks.
pub fn index(runner: &RunnerNow, repositories: &[(RepositoryView, Vec<&CheckRecord>)]) -> Markup {
    let executor = runner.summary.executor.as_ref();
    let live = repositories.iter().any(|(_, heads)| heads.iter().any(|record| !record.status.is_final()));
    frame(
        "status",
        html! {
            h1 { "Runner " (name(&runner.summary.runner_id)) }
            p {
                "Executor " (name(&runner.summary.executor_name))
                @if let Some(executor) = executor { " (" (name(&executor.name)) " " (name(&executor.version)) ")" }
                ", " (runner.in_flight.len()) " run(s) in flight, " (runner.summary.concurrency) " at once. "
                a href="/runner" { "More about the runner" } "."
            }
            h2 { "Repositories" }
            @if repositories.is_empty() { p.none { "No repository yet." } }
            @for (repository, heads) in repositories {
                section.repository {
                    h3 { a href=(repository_href(&repository.key)) { (name(repository.url.as_deref().unwrap_or(&repository.key))) } }
                    table.branches {
                        @for (branch, commit) in &repository.seen.branches {
                            @let checks: Vec<&CheckRecord> = heads.iter().copied().filter(|r| &r.target.commit == commit).collect();
                            tr { td { (name(branch)) } td.commit { (format::short(commit)) } td { (badges(&checks)) } }
                        }
                    }
                }
            }
        },
        live,
    )
}

/// A repository's checks by commit and by pull head, each list oldest first, and its most
/// recent commits, newest first.
struct Grouped<'a> {
    by_commit: HashMap<&'a str, Vec<&'a CheckRecord>>,
    by_pull: HashMap<(u64, &'a str), Vec<&'a CheckRecord>>,
    recent: Vec<&'a str>,
}

/// `records` (oldest first) grouped for the repository's page.
fn grouped(records: &[std::sync::Arc<CheckRecord>]) -> Grouped<'_> {
    let mut by_commit: HashMap<&str, Vec<&CheckRecord>> = HashMap::new();
    let mut by_pull: HashMap<(u64, &str), Vec<&CheckRecord>> = HashMap::new();
    let mut recent: Vec<&str> = Vec::new();
    for record in records.iter().rev() {
        let commit = record.target.commit.as_str();
        let list = by_commit.entry(commit).or_default();
        if list.is_empty() && recent.len() < RECENT_COMMITS {
            recent.push(commit);
        }
        list.push(record);
        if let (Some(number), Some(head)) = (record.target.pull, record.target.head.as_deref()) {
            by_pull.entry((number, head)).or_default().push(record);
        }
    }
    for list in by_commit.values_mut().chain(by_pull.values_mut()) {
        list.reverse();
    }
    Grouped { by_commit, by_pull, recent }
}

/// The repository's branches and pulls, each with the latest check of each workflow on its head.
fn heads(
    repository: &RepositoryView,
    by_commit: &HashMap<&str, Vec<&CheckRecord>>,
    by_pull: &HashMap<(u64, &str), Vec<&CheckRecord>>,
) -> Markup {
    let none: Vec<&CheckRecord> = Vec::new();
    html! {
        h2 { "Branches" }
        @if repository.seen.branches.is_empty() { p.none { "None seen yet." } }
        table.branches {
            @for (branch, commit) in &repository.seen.branches {
                tr {
                    td { (name(branch)) }
                    td.commit { (format::short(commit)) }
                    td { (badges(&latest_per_workflow(by_commit.get(commit.as_str()).unwrap_or(&none)))) }
                }
            }
        }
        @if !repository.seen.pulls.is_empty() {
            h2 { "Pulls" }
            table.branches {
                @for (number, head) in &repository.seen.pulls {
                    tr {
                        td { "pull/" (number) }
                        td.commit { (format::short(head)) }
                        td { (badges(&latest_per_workflow(by_pull.get(&(*number, head.as_str())).unwrap_or(&none)))) }
                    }
                }
            }
        }
    }
}

/// A repository: its branches, pulls and recent commits with their checks, and its queues.
pub fn repository(
    repository: &RepositoryView,
    records: &[std::sync::Arc<CheckRecord>],
    unreadable: &[String],
    queues: &[String],
    commits: &HashMap<String, CommitInfo>,
    now_ms: u64,
) -> Markup {
    let Grouped { by_commit, by_pull, recent } = grouped(records);
    let title = repository.url.as_deref().unwrap_or(&repository.key);
    let none: Vec<&CheckRecord> = Vec::new();
    let live = recent
        .iter()
        .flat_map(|commit| by_commit.get(commit).into_iter().flatten())
        .any(|record| !record.status.is_final());
    frame(
        title,
        html! {
            h1 { (name(title)) }
            p.meta {
                (records.len()) " check(s). "
                a href={ "/api/repositories/" (repository.key) "/checks" } { "As JSON" } "."
            }
            @if !unreadable.is_empty() {
                p.warning {
                    (unreadable.len()) " check record(s) of this repository cannot be read and are not listed (the \
                     runner's log says why): "
                    @for (at, file) in unreadable.iter().enumerate() {
                        @if at > 0 { ", " }
                        code { (name(file)) }
                    }
                    "."
                }
            }
            @if !queues.is_empty() {
                h2 { "Merge queues" }
                ul { @for branch in queues { li { a href=(queue_href(&repository.key, branch)) { (name(branch)) } } } }
            }
            (heads(repository, &by_commit, &by_pull))
            h2 { "Recent commits" }
            @if recent.is_empty() { p.none { "No checks yet." } }
            @for commit in &recent {
                section.commit {
                    @let checks = by_commit.get(commit).unwrap_or(&none);
                    h3 {
                        span.commit { (format::short(commit)) }
                        @if let Some(info) = commits.get(*commit) { " " span.subject { (name(&info.subject)) } }
                    }
                    p.meta {
                        @if let Some(info) = commits.get(*commit) { (name(&info.author)) ", authored " (when(info.authored_ms, now_ms)) "; " }
                        @if let Some(newest) = checks.iter().map(|check| check.queued_at).max() { "checked " (when(newest, now_ms)) }
                    }
                    (checks_table(checks, now_ms))
                }
            }
        },
        live,
    )
}

/// What the check page shows of an output.
pub struct ShownOutput {
    /// Its path in the outputs folder.
    pub path: String,
    /// Its size.
    pub bytes: u64,
    /// How it is shown.
    pub kind: Kind,
    /// The start of a text output.
    pub preview: Option<String>,
}

/// A check: what it ran on, its steps, cause, outputs and log.
pub fn check(
    record: &CheckRecord,
    commit: Option<&CommitInfo>,
    outputs: &[ShownOutput],
    log: &[u8],
    live_from: Option<u64>,
    now_ms: u64,
) -> Markup {
    // A live log is drawn as far as it is whole, and grows from there.
    let live = live_from.map(|from| format!("{}/log/live?from={from}", check_href(record)));
    let (drawn, tail) = super::log_view::render(record, log, live.as_deref());
    let title = format!("{} on {}", record.workflow, format::short(&record.target.commit));
    let repository = repository_href(&record.repository_key);
    layout(
        &title,
        html! {
            p.meta { a href=(repository) { (name(&record.repository)) } }
            h1 { (name(&record.workflow)) " " (status(record.status.as_str())) }
            @if let Some(cause) = &record.cause { p.cause { "Cause: " (name(cause)) } }
            @if let Some(tail) = tail { (tail) }
            table.facts {
                tr { th { "trust" } td { (format::trust(record)) @if record.trusted { " (trusted: secrets, cache kept)" } @else { " (untrusted: no secrets)" } } }
                tr { th { "on" } td { (name(&format::target(record))) " " span.commit { (name(&record.target.commit)) } } }
                @if let Some(head) = &record.target.head { tr { th { "head" } td { span.commit { (name(head)) } } } }
                @if let Some(commit) = commit { tr { th { "commit" } td { (commit_line(commit, now_ms)) } } }
                tr { th { "ref" } td { (name(&record.target.git_ref)) } }
                tr { th { "runner" } td { (name(&record.runner_id)) } }
                tr { th { "run" } td { (name(&record.run_id)) } }
                @if let Some(repeated) = &record.reruns { tr { th { "repeats" } td { a href=(run_href(record, repeated)) { "run " (name(repeated)) } } } }
                @if !record.run_again_as.is_empty() {
                    tr { th { "run again as" } td { @for (n, again) in record.run_again_as.iter().enumerate() { @if n > 0 { ", " } a href=(run_href(record, again)) { "run " (name(again)) } } } }
                }
                tr { th { "queued" } td { (when(record.queued_at, now_ms)) } }
                @if let Some(at) = record.started_at { tr { th { "started" } td { (when(at, now_ms)) } } }
                @if let Some(at) = record.finished_at { tr { th { "finished" } td { (when(at, now_ms)) } } }
                tr { th { "duration" } td { (format::check_duration(record, now_ms)) } }
            }
            h2 { "Steps" }
            @if record.steps.is_empty() && record.status.is_final() {
                p.none { "No step ran." }
            } @else {
                @if record.steps.is_empty() { p.none #no-steps { "No step has started yet." } }
                table.steps {
                    thead { tr { th { "step" } th { "status" } th { "exit code" } th { "time" } } }
                    tbody #steps {
                        @for row in step_rows(record) {
                            tr {
                                td.step { (row.name) }
                                td { span class={ "status " (row.class) } { (row.status) } @if let Some(reason) = &row.reason { " " span.reason { "(" (reason) ")" } } }
                                td { (row.exit) }
                                td { (row.time) }
                            }
                        }
                    }
                }
            }
            @if !record.caches.is_empty() {
                h2 { "Caches" }
                ul { @for cache in &record.caches { li { (name(&cache.path)) ": " @if cache.warm { "warm" } @else { "cold" } ", " (name(&cache.outcome)) } } }
            }
            @if !outputs.is_empty() {
                h2 { "Outputs" }
                @for output in outputs {
                    @let href = output_href(record, &output.path);
                    figure.output {
                        figcaption { a href=(href) { (name(&output.path)) } " " span.size { (crate::printable::size(output.bytes)) } }
                        @match output.kind {
                            Kind::Image(_) => { img.output src=(href) alt=(name(&output.path)); }
                            Kind::Text => { pre.preview { (printable::log(output.preview.as_deref().unwrap_or("").as_bytes())) } }
                            Kind::Other => { span.none { "download" } }
                        }
                    }
                }
            }
            h2 { "Log" }
            p.meta {
                a href={ (check_href(record)) "/log" } { "Plain text" } "."
                @if record.log_truncated { " The log was cut at its cap of 1 MB." }
            }
            @if live.is_some() {
                p #live-state { "Running: the log grows below as the run goes (with JavaScript; without it, reload the page)." }
            }
            (drawn)
            @if live.is_some() { script src="/static/page.js" {} }
        },
    )
}

/// A branch's merge queue: its pulls in order with their state and reasons, then its batches.
pub fn queue(key: &str, queue: &QueueState, checks: &HashMap<&str, &CheckRecord>) -> Markup {
    let title = format!("merge queue of {}", queue.branch);
    let check_link = |run_id: &str| match checks.get(run_id) {
        Some(record) => {
            html! { a.badge href=(check_href(record)) { (name(&record.workflow)) " " (status(record.status.as_str())) } " " }
        }
        None => html! { span.none { (name(run_id)) " (no record)" } " " },
    };
    layout(
        &title,
        html! {
            p.meta { a href=(repository_href(key)) { (name(&queue.repository)) } }
            h1 { "Merge queue of " (name(&queue.branch)) }
            p.meta { a href={ "/api" (queue_href(key, &queue.branch)) } { "As JSON" } "." }
            h2 { "Pulls" }
            @if queue.entries.is_empty() { p.none { "Empty." } }
            table.queue {
                thead { tr { th { "pull" } th { "head" } th { "state" } th { "reason" } th { "pre-flights" } th { "batch" } } }
                tbody {
                    @for entry in &queue.entries {
                        tr {
                            td { "pull/" (entry.number) @if entry.retry { " (retry)" } }
                            td.commit data-label="head" { (format::short(&entry.head)) }
                            td { (status(entry.state.as_str())) }
                            td { @if let Some(reason) = &entry.reason { (name(reason)) } }
                            td data-label="pre-flights" { @for run_id in &entry.preflights { (check_link(run_id)) } }
                            td.commit data-label="batch" { @if let Some(batch) = &entry.batch { (format::short(batch)) } }
                        }
                    }
                }
            }
            h2 { "Batches" }
            @if queue.batches.is_empty() { p.none { "None tried yet." } }
            table.queue {
                thead { tr { th { "batch" } th { "base" } th { "pulls" } th { "status" } th { "cause" } th { "checks" } } }
                tbody {
                    @for batch in queue.batches.iter().rev() {
                        tr {
                            td.commit data-label="batch" { (format::short(&batch.commit)) }
                            td.commit data-label="base" { (format::short(&batch.base)) }
                            td { @for number in &batch.pulls { "pull/" (number) " " } }
                            td { (status(batch.status.as_str())) }
                            td { @if let Some(cause) = &batch.cause { (name(cause)) } }
                            td data-label="checks" { @for run_id in &batch.runs { (check_link(run_id)) } }
                        }
                    }
                }
            }
        },
    )
}

/// The runner: its executor from the handshake, capabilities, concurrency, runs in flight and
/// the last orphan sweep.
pub fn runner(runner: &RunnerNow) -> Markup {
    let summary = &runner.summary;
    layout(
        "runner",
        html! {
            h1 { "Runner " (name(&summary.runner_id)) }
            p.meta { a href="/api/runner" { "As JSON" } "." }
            table.facts {
                tr { th { "executor" } td { (name(&summary.executor_name)) } }
                @if let Some(executor) = &summary.executor {
                    tr { th { "handshake" } td { (name(&executor.name)) " " (name(&executor.version)) } }
                }
                @if let Some(version) = summary.protocol_version { tr { th { "protocol" } td { "version " (version) } } }
                tr { th { "concurrency" } td { (summary.concurrency) " run(s) at once" } }
                tr { th { "poll" } td { "every " (summary.poll_seconds) " s" } }
                tr { th { "pulls" } td { @if summary.pulls { "run" } @else { "not run" } } }
                tr { th { "merge queues" } td { @if summary.queue { "landed when this runner is the lander" } @else { "not landed" } } }
                tr { th { "started" } td { (format::time(summary.started_at)) } }
            }
            h2 { "Capabilities" }
            @match &summary.capabilities {
                Some(capabilities) => {
                    table.facts {
                        tr { th { "isolation" } td { (format!("{:?}", capabilities.isolation).to_lowercase()) } }
                        tr { th { "caches" } td { (yes(capabilities.caches)) } }
                        tr { th { "secrets" } td { (yes(capabilities.secrets)) } }
                        tr { th { "outputs" } td { (yes(capabilities.outputs)) } }
                        tr { th { "images" } td { (yes(capabilities.images)) } }
                        tr { th { "network policy" } td { (yes(capabilities.network_policy)) } }
                        tr { th { "sessions" } td { @if let Some(most) = capabilities.max_sessions { "at most " (most) } @else { "no limit" } } }
                    }
                }
                None => { p.none { "The executor's handshake is not known." } }
            }
            h2 { "Runs in flight" }
            @if runner.in_flight.is_empty() { p.none { "None." } }
            ul {
                @for (run_id, entry) in &runner.in_flight {
                    li { a href={ "/repositories/" (entry.repository_key) "/checks/" (run_id) } { (name(run_id)) } " " (status(entry.status.as_str())) }
                }
            }
            h2 { "Last orphan sweep" }
            @match &runner.last_sweep {
                Some(sweep) => {
                    p { (format::time(sweep.at)) ": removed " (sweep.removed.len()) " resource(s)" @if !sweep.failures.is_empty() { ", " (sweep.failures.len()) " failure(s)" } "." }
                    ul {
                        @for removed in &sweep.removed { li { (name(removed)) } }
                        @for failure in &sweep.failures { li.bad { (name(failure)) } }
                    }
                }
                None => { p.none { "None yet." } }
            }
        },
    )
}

fn yes(value: bool) -> &'static str {
    if value { "yes" } else { "no" }
}

/// The page of a request for nothing the runner has.
pub fn not_found() -> Markup {
    layout("not found", html! { h1 { "Not found" } p { "Nothing here: " a href="/" { "the repositories" } "." } })
}
