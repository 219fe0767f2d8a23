//! §7, where a secret must never be: on an executor process of its own, a step given a secret
//! looks for it on every process's command line it can read and in every file under the
//! session's folders, while the suite looks on this host's command lines and in the executor's
//! own environment; and every line of the executor's stderr and every `log` line, from its start
//! to its exit, is searched for it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use knotless_protocol::messages::*;
use tokio::sync::mpsc;

use super::Outcome;
use super::raw::Raw;
use super::suite::quoted;
use knotless_host::{HostConfig, SessionEvent, StderrWatch};

/// The rule each place breaks.
const COMMAND_LINE_RULE: &str =
    "§7: an executor MUST NOT put a secret on any command line, its own children's included";
const PLACES_RULE: &str = "§7: an executor MUST NOT put a secret in its own environment, in a file (in the \
                           environment or on the host), in a `log` notification, or on stderr";

/// What the step prints before it looks, and then waits long enough for the suite to look too.
const PROBING: &str = "knotless-check-probing";

/// Where the secret was seen.
type Sightings = Arc<Mutex<Vec<String>>>;

fn saw(sightings: &Sightings, place: String) {
    let mut sightings = sightings.lock().unwrap_or_else(|poison| poison.into_inner());
    if !sightings.contains(&place) {
        sightings.push(place);
    }
}

/// The step that looks for the secret in `$CHECK_SECRET`, without ever putting it on a command
/// line of its own: on every process's command line (naming the process by what its first word
/// holds before the secret), and in every file under `folders`.
fn probe(folders: &[String]) -> String {
    let folders: Vec<String> = folders.iter().map(|folder| quoted(folder)).collect();
    format!(
        "echo {PROBING}\n\
         for f in /proc/[0-9]*/cmdline; do\n\
           p=${{f#/proc/}}; p=${{p%/cmdline}}\n\
           c=$(tr '\\000' ' ' < \"$f\" 2>/dev/null) || continue\n\
           case \"$c\" in *\"$CHECK_SECRET\"*) set -f; set -- $c; set +f; echo \"command line of process $p (${{1%%\"$CHECK_SECRET\"*}})\";; esac\n\
         done\n\
         for d in {}; do\n\
           [ -d \"$d\" ] || continue\n\
           printf '%s\\n' \"$CHECK_SECRET\" | grep -rlsF -f - \"$d\" | sed 's/^/file /' || true\n\
         done\n\
         sleep 5\n",
        folders.join(" ")
    )
}

/// The folders the step searches: the session's three, and the folder that holds them when they
/// share one that is not `/` (a session's own folder on a host).
fn folders(paths: &SessionPaths) -> Vec<String> {
    let mut folders = vec![paths.work.clone(), paths.steps.clone(), paths.outputs.clone()];
    let parent = |path: &str| std::path::Path::new(path).parent().map(|parent| parent.to_path_buf());
    if let (Some(work), Some(steps), Some(outputs)) =
        (parent(&paths.work), parent(&paths.steps), parent(&paths.outputs))
        && work == steps
        && work == outputs
        && work.parent().is_some()
    {
        folders.push(work.display().to_string());
    }
    folders
}

/// This host's processes whose command line holds `secret`, and the executor's own environment
/// when it does.
fn host_sightings(secret: &[u8], executor: Option<u32>) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if contains(&cmdline, secret) {
            // Named by its program, the secret itself left out.
            let program = cmdline.split(|byte| *byte == 0).next().unwrap_or_default();
            let program = String::from_utf8_lossy(program).replace(&*String::from_utf8_lossy(secret), "***");
            found.push(format!("the command line of process {pid} on this host ({program})"));
        }
    }
    if let Some(pid) = executor
        && std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|environ| contains(&environ, secret))
    {
        found.push(format!("the executor's own environment (process {pid})"));
    }
    found
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|window| window == needle)
}

/// The case: a session on a process of its own, one step given the secret, `stop`, `shutdown`.
pub(super) async fn out_of_sight(config: &HostConfig, start: StartParams, nonce: &str) -> Outcome {
    let secret = format!("knotless-check-secret-{nonce}-{:x}", std::process::id().wrapping_mul(2_654_435_761));
    let sightings: Sightings = Arc::default();
    let (watched, seen) = (secret.clone(), sightings.clone());
    let watch: StderrWatch = Arc::new(move |line: &str| {
        if line.contains(&watched) {
            saw(&seen, "a line of the executor's stderr".into());
        }
    });
    let (unrouted, mut logs) = mpsc::channel::<LogParams>(knotless_host::UNROUTED_LOGS);
    // Read as they come: the channel is bounded, and a full one holds the executor back.
    let (logged, seen_in_logs) = (secret.clone(), sightings.clone());
    let reading = tokio::spawn(async move {
        while let Some(log) = logs.recv().await {
            if log.message.contains(&logged) {
                saw(&seen_in_logs, "a `log` notification for no session".into());
            }
        }
    });
    let raw = Raw::spawn_watched(config, false, Some(watch), unrouted)?;
    let outcome = look(&raw, config, start, &secret, &sightings).await;
    raw.end(config.grace).await;
    // The connection's end drops the last sender: the reading ends with it.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), reading).await;
    let detail = outcome?;
    let sightings = sightings.lock().unwrap_or_else(|poison| poison.into_inner()).clone();
    let on_command_lines: Vec<&String> = sightings.iter().filter(|place| place.contains("command line")).collect();
    let elsewhere: Vec<&String> = sightings.iter().filter(|place| !place.contains("command line")).collect();
    let mut faults = Vec::new();
    if !on_command_lines.is_empty() {
        let places: Vec<&str> = on_command_lines.iter().map(|place| place.as_str()).collect();
        faults.push(format!("the secret was on {}; {COMMAND_LINE_RULE}", places.join(", ")));
    }
    if !elsewhere.is_empty() {
        let places: Vec<&str> = elsewhere.iter().map(|place| place.as_str()).collect();
        faults.push(format!("the secret was in {}; {PLACES_RULE}", places.join(", ")));
    }
    if !faults.is_empty() {
        return Err(faults.join("; "));
    }
    Ok(detail)
}

async fn look(raw: &Raw, config: &HostConfig, start: StartParams, secret: &str, sightings: &Sightings) -> Outcome {
    let (session, mut events, paths) = raw.open_with_paths(config, &start).await?;
    let searched = folders(&paths);
    let params = CommandParams {
        session: session.clone(),
        step: 0,
        name: "check".into(),
        script: probe(&searched),
        env: BTreeMap::new(),
        secrets: BTreeMap::from([("CHECK_SECRET".to_string(), secret.to_string())]),
        workdir: None,
        timeout_ms: 120_000,
    };
    raw.connection.set_running(&session, Some(params.step));
    let answer = raw.request::<rpc::Command>(&params, Duration::from_secs(180));
    tokio::pin!(answer);
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let mut looked = false;
    let executor = raw.process.pid();
    let take = |event: SessionEvent, stdout: &mut Vec<u8>, stderr: &mut Vec<u8>| match event {
        SessionEvent::Output { stream: Stream::Stdout, bytes, .. } => stdout.extend_from_slice(&bytes),
        SessionEvent::Output { bytes, .. } => stderr.extend_from_slice(&bytes),
        SessionEvent::Log { message, .. } => {
            if message.contains(secret) {
                saw(sightings, "a `log` notification for the session".into());
            }
        }
    };
    let result = loop {
        tokio::select! {
            biased;
            Some(event) = events.recv() => {
                take(event, &mut stdout, &mut stderr);
                if !looked && String::from_utf8_lossy(&stdout).contains(PROBING) {
                    looked = true;
                    for place in host_sightings(secret.as_bytes(), executor) {
                        saw(sightings, place);
                    }
                }
            }
            result = &mut answer => break result,
        }
    };
    raw.connection.set_running(&session, None);
    let stop = StopParams { session: session.clone(), keep: false, timeout_ms: 60_000 };
    let stopped = raw.request::<rpc::Stop>(&stop, Duration::from_secs(60)).await;
    while let Ok(event) = events.try_recv() {
        take(event, &mut stdout, &mut stderr);
    }
    let result = result.map_err(|why| raw.failed(why))?;
    if result.exit_code != 0 {
        let text = String::from_utf8_lossy(&stderr[..stderr.len().min(300)]).trim().to_string();
        return Err(format!(
            "the step that looks for the secret exited {}, expected 0 (its stderr: {text})",
            result.exit_code
        ));
    }
    if !looked {
        return Err(format!("the step never said {PROBING}, so the suite could not look on this host"));
    }
    for line in String::from_utf8_lossy(&stdout).lines() {
        if let Some(process) = line.strip_prefix("command line of ") {
            saw(sightings, format!("the command line of {process} in the environment"));
        } else if let Some(file) = line.strip_prefix("file ") {
            saw(sightings, format!("the file {file}"));
        }
    }
    stopped.map_err(|why| format!("stop: {why}"))?;
    Ok(format!(
        "not on a command line (in the environment or on this host), in the executor's environment, in a file \
         under {}, on stderr or in a log line",
        searched.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_folder_on_a_host_is_searched_and_the_root_is_not() {
        let paths = |root: &str| SessionPaths {
            work: format!("{root}/work"),
            steps: format!("{root}/steps"),
            outputs: format!("{root}/outputs"),
        };
        assert_eq!(folders(&paths("/tmp/s")), ["/tmp/s/work", "/tmp/s/steps", "/tmp/s/outputs", "/tmp/s"]);
        assert_eq!(folders(&paths("")), ["/work", "/steps", "/outputs"]);
    }

    #[test]
    fn the_host_search_finds_a_command_line_and_misses_what_is_not_there() {
        // This test's own command line holds its name, which the search finds.
        let own: Vec<u8> = std::fs::read("/proc/self/cmdline").expect("cmdline");
        let word = own.split(|byte| *byte == 0).next().expect("argv0").to_vec();
        let found = host_sightings(&word, None);
        assert!(found.iter().any(|place| place.contains(&std::process::id().to_string())), "{found:?}");
        assert!(host_sightings(b"knotless-check-never-on-any-command-line-\x01", None).is_empty());
    }
}
