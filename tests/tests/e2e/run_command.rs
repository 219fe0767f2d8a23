//! `knotless-run run` through the shell executor: exit codes, timeouts, cancellation, secrets,
//! workflow errors, commits and outputs.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use knotless_tests::{Repo, command_lines, knotless_run, process_running, ran, wait_until};

use crate::{run_shell_with, sessions_in as walk, shell_args, summary_row as row};

fn run_shell(repo: &Repo, extra: &[&str]) -> knotless_tests::Ran {
    run_shell_with(repo, extra, &[])
}

#[test]
fn a_step_that_exits_non_zero_ends_failure_with_its_exit_code() {
    let repo = Repo::new();
    repo.workflow("ci", "steps:\n  - name: pass\n    run: 'true'\n  - name: broken\n    run: exit 3\n  - name: never\n    run: echo never\n");
    let run = run_shell(&repo, &[]);
    assert_eq!(run.code, Some(1), "{}", run.both());
    assert_eq!(row(&run.stdout, "ci", "broken")[..4], ["ci", "failure", "broken", "3"], "{}", run.both());
    assert_eq!(row(&run.stdout, "ci", "never")[..4], ["ci", "skipped", "never", "-"], "{}", run.both());
    assert!(run.stdout.contains("ci: failure: step broken exited with 3"), "{}", run.both());
}

#[test]
fn a_failed_steps_last_lines_are_repeated_under_the_summary() {
    let repo = Repo::new();
    repo.workflow(
        "ci",
        "steps:\n  - name: chatty\n    run: echo fine\n  - name: broken\n    run: |\n      i=1\n      while [ $i -le 30 ]; do echo \"out $i\"; i=$((i+1)); done\n      exit 4\n",
    );
    repo.workflow("err", "steps:\n  - name: loud\n    run: echo 'on stderr' >&2; exit 5\n");
    repo.workflow("ok", "steps:\n  - name: quiet\n    run: echo all good\n");
    let run = run_shell(&repo, &[]);
    assert_eq!(run.code, Some(1), "{}", run.both());
    let after: Vec<&str> = run.stdout.lines().skip_while(|line| !line.starts_with("workflow  status")).collect();
    let header = after.iter().position(|line| *line == "ci: the last 20 line(s) of step broken:");
    let header = header.unwrap_or_else(|| panic!("no tail under the summary\n{}", run.both()));
    let tail: Vec<&str> =
        after[header + 1..].iter().copied().take_while(|line| line.starts_with("ci/broken | ")).collect();
    let expected: Vec<String> = (11..=30).map(|n| format!("ci/broken | out {n}")).collect();
    assert_eq!(tail, expected, "{}", run.both());
    // Its stderr too.
    let at = after.iter().position(|line| *line == "err: the last 1 line(s) of step loud:");
    assert_eq!(at.map(|at| after[at + 1]), Some("err/loud | on stderr"), "{}", run.both());
    // Only the failed step is repeated: not the passing step before it, nor a passing workflow.
    let summary_part = after.join("\n");
    assert!(!summary_part.contains("| fine") && !summary_part.contains("| all good"), "{}", run.both());
}

#[test]
fn each_failed_steps_last_lines_are_repeated_whatever_ran_after_it() {
    let repo = Repo::new();
    repo.workflow(
        "ci",
        "steps:\n  - name: soft\n    continue-on-error: true\n    run: echo soft-out; exit 2\n  \
         - name: broken\n    run: echo broken-out; echo broken-err >&2; exit 4\n  \
         - name: report\n    if: failure()\n    run: echo reported\n  \
         - name: cleanup\n    if: always()\n    run: echo cleaned\n",
    );
    let run = run_shell(&repo, &[]);
    assert_eq!(run.code, Some(1), "{}", run.both());
    let after: Vec<&str> = run.stdout.lines().skip_while(|line| !line.starts_with("workflow  status")).collect();
    let tail = |step: &str| -> Vec<&str> {
        let Some(at) = after
            .iter()
            .position(|line| line.starts_with("ci: the last ") && line.ends_with(&format!(" of step {step}:")))
        else {
            return Vec::new();
        };
        after[at + 1..].iter().copied().take_while(|line| line.starts_with(&format!("ci/{step} | "))).collect()
    };
    assert_eq!(tail("soft"), ["ci/soft | soft-out"], "{}", run.both());
    let broken = tail("broken");
    assert_eq!(broken.len(), 2, "{}", run.both());
    assert!(broken.contains(&"ci/broken | broken-out") && broken.contains(&"ci/broken | broken-err"), "{}", run.both());
    assert!(tail("report").is_empty() && tail("cleanup").is_empty(), "passing steps are not repeated: {}", run.both());
    let summary = after.join("\n");
    assert!(summary.find("of step soft:") < summary.find("of step broken:"), "in the steps' order: {}", run.both());
}

#[test]
fn two_repositories_keep_their_outputs_apart_and_a_run_without_outputs_makes_no_folder() {
    let cache = tempfile::tempdir().expect("tempdir");
    let repos = [Repo::new(), Repo::new()];
    for (number, repo) in repos.iter().enumerate() {
        repo.workflow(
            "test",
            &format!("steps:\n  - name: out\n    run: echo {number} > \"$KNOTLESS_RUN_OUTPUTS/which\"\n"),
        );
        repo.workflow("none", "steps:\n  - name: quiet\n    run: 'true'\n");
    }
    for repo in &repos {
        let work = tempfile::tempdir().expect("tempdir");
        let args = shell_args(repo, work.path());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut command = knotless_run(&args);
        command.env("XDG_CACHE_HOME", cache.path());
        let run = ran(command);
        assert_eq!(run.code, Some(0), "{}", run.both());
    }
    let root = cache.path().join("knotless/outputs");
    let mut folders: Vec<_> = std::fs::read_dir(&root).expect("the outputs root").flatten().map(|e| e.path()).collect();
    folders.sort();
    assert_eq!(folders.len(), 2, "one folder a repository: {folders:?}");
    assert!(folders.iter().all(|folder| folder.join("test").is_dir()), "each holds its workflows: {folders:?}");
    let mut seen: Vec<String> = folders
        .iter()
        .map(|folder| {
            assert!(!folder.join("none").exists(), "a run without outputs made {}", folder.join("none").display());
            std::fs::read_to_string(folder.join("test/which")).expect("each repository's own output")
        })
        .collect();
    seen.sort();
    assert_eq!(seen, ["0\n", "1\n"]);
}

#[test]
fn a_step_past_its_timeout_fails_without_exit_code_and_its_background_sleep_is_gone() {
    let repo = Repo::new();
    repo.workflow("slow", "steps:\n  - name: hang\n    run: sleep 917253 & sleep 917254\n    timeout: 1s\n");
    let run = run_shell(&repo, &[]);
    assert_eq!(run.code, Some(1), "{}", run.both());
    assert_eq!(row(&run.stdout, "slow", "hang")[..5], ["slow", "timed", "out", "hang", "-"], "{}", run.both());
    assert!(run.stdout.contains("slow: failure: step hang was killed at its timeout"), "{}", run.both());
    assert!(!process_running("sleep 917253"), "the background sleep outlived the step");
    assert!(!process_running("sleep 917254"), "the step's sleep outlived it");
}

#[test]
fn ctrl_c_cancels_the_run_and_leaves_no_process_behind() {
    let repo = Repo::new();
    repo.workflow("long", "steps:\n  - name: wait\n    run: echo started; sleep 918273 & sleep 918274\n");
    let work = tempfile::tempdir().expect("tempdir");
    let args = shell_args(&repo, work.path());
    let mut child = knotless_run(&args.iter().map(String::as_str).collect::<Vec<_>>())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.expect("line");
        let started = line.contains("long/wait | started");
        seen.push(line);
        if started {
            break;
        }
    }
    assert!(seen.iter().any(|line| line.contains("started")), "the step never started: {seen:?}");
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("SIGINT");
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(130), "a cancelled run exits 130: {rest:?}");
    assert!(rest.iter().any(|line| line.contains("long: cancelled: cancelled during step wait")), "{rest:?}");
    assert!(
        !process_running("sleep 918273") && !process_running("sleep 918274"),
        "the step's processes outlived the cancel"
    );
    assert!(wait_until(Duration::from_secs(5), || walk(work.path()).is_empty()), "the session folder is removed");
}

#[test]
fn what_a_killed_run_left_is_swept_by_the_next_run_and_never_a_live_runs() {
    let repo = Repo::new();
    repo.workflow("long", "steps:\n  - name: wait\n    run: echo started; sleep 918275\n");
    repo.workflow("quick", "steps:\n  - name: hi\n    run: echo hi\n");
    let work = tempfile::tempdir().expect("tempdir");
    // A cache folder of this test's own: the runs' locks are not shared with other tests'.
    let cache = tempfile::tempdir().expect("tempdir");
    let start_long = || {
        let mut args = shell_args(&repo, work.path());
        args.extend(["--workflow".into(), "long".into()]);
        let mut child = knotless_run(&args.iter().map(String::as_str).collect::<Vec<_>>())
            .env("XDG_CACHE_HOME", cache.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let started = lines.by_ref().map_while(Result::ok).any(|line| line.contains("long/wait | started"));
        assert!(started, "the step never started");
        (child, lines)
    };
    let quick = || {
        let mut args = shell_args(&repo, work.path());
        args.extend(["--workflow".into(), "quick".into()]);
        let mut command = knotless_run(&args.iter().map(String::as_str).collect::<Vec<_>>());
        command.env("XDG_CACHE_HOME", cache.path());
        ran(command)
    };
    // A live run's session is never swept by a run beside it.
    let (mut live, _lines) = start_long();
    let beside = quick();
    assert_eq!(beside.code, Some(0), "{}", beside.both());
    assert!(!beside.stderr.contains("swept"), "{}", beside.both());
    assert_eq!(walk(work.path()).len(), 1, "the live run's session is still there");
    // The runner and its executor killed outright: the session folder stays behind.
    // The children of each of its threads: the executor is started by whichever runs the run.
    let executor = std::fs::read_dir(format!("/proc/{}/task", live.id()))
        .expect("the runner's threads")
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("children")).ok())
        .flat_map(|children| children.split_whitespace().filter_map(|pid| pid.parse::<i32>().ok()).collect::<Vec<_>>())
        .collect::<Vec<_>>();
    assert!(!executor.is_empty(), "the runner has no executor child");
    for pid in executor.iter().copied().chain([live.id() as i32]) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    }
    live.wait().expect("wait");
    let left = walk(work.path());
    assert_eq!(left.len(), 1, "a killed run leaves its session: {left:?}");
    let next = quick();
    assert_eq!(next.code, Some(0), "{}", next.both());
    assert!(next.stderr.contains("swept what an earlier run left: folder "), "{}", next.both());
    assert!(walk(work.path()).is_empty(), "swept: {:?}", walk(work.path()));
    assert!(wait_until(Duration::from_secs(5), || !process_running("sleep 918275")), "the step outlived its run");
}

/// `--keep` keeps a run's environment through the sweeps of the runs after it, until the user
/// removes it.
#[test]
fn a_kept_environment_outlives_the_sweep_of_the_next_run() {
    let repo = Repo::new();
    repo.workflow("quick", "steps:\n  - name: hi\n    run: echo hi > left-here\n");
    let work = tempfile::tempdir().expect("tempdir");
    let cache = tempfile::tempdir().expect("tempdir");
    let quick = |extra: &[&str]| {
        let mut args = shell_args(&repo, work.path());
        args.extend(["--workflow", "quick"].iter().chain(extra).map(|arg| arg.to_string()));
        let mut command = knotless_run(&args.iter().map(String::as_str).collect::<Vec<_>>());
        command.env("XDG_CACHE_HOME", cache.path());
        ran(command)
    };
    let kept = quick(&["--keep"]);
    assert_eq!(kept.code, Some(0), "{}", kept.both());
    let left = walk(work.path());
    assert_eq!(left.len(), 1, "the kept session's folder: {left:?}");
    let folder = std::path::PathBuf::from(&left[0]);
    assert_eq!(std::fs::read_to_string(folder.join("work/left-here")).expect("the step's file"), "hi\n");
    let next = quick(&[]);
    assert_eq!(next.code, Some(0), "{}", next.both());
    assert!(!next.stderr.contains("swept"), "the next run swept the kept session: {}", next.both());
    assert_eq!(walk(work.path()), left, "the kept session is still there, and the next run left nothing");
    // The user removes it: the mark goes at the next start of its id, or here.
    let runner = folder.parent().and_then(|runner| runner.file_name()).expect("runner folder");
    let session = folder.file_name().expect("session folder");
    let (runner, session) = (runner.to_str().expect("utf-8"), session.to_str().expect("utf-8"));
    assert!(knotless_protocol::kept::sessions(runner).iter().any(|kept| kept == session), "marked kept");
    std::fs::remove_dir_all(&folder).expect("remove");
    knotless_protocol::kept::unmark(runner, session);
}

#[test]
fn a_secret_is_in_no_command_line_and_masked_even_split_across_writes() {
    let repo = Repo::new();
    let scratch = tempfile::tempdir().expect("tempdir");
    let proceed = scratch.path().join("proceed");
    let secret = "canary-7f3a9c-value";
    repo.workflow(
        "secret",
        &format!(
            "steps:\n  - name: use\n    secrets: [CANARY]\n    run: |\n      printf 'first half %s' \"${{CANARY%%-value}}\"\n      echo scan-now >&2\n      while [ ! -e '{}' ]; do sleep 0.05; done\n      printf '%s\\n' \"-value and the whole: $CANARY\"\n",
            proceed.display()
        ),
    );
    let work = tempfile::tempdir().expect("tempdir");
    let mut args = shell_args(&repo, work.path());
    args.extend(["--secret".to_string(), "CANARY".to_string()]);
    let mut child = knotless_run(&args.iter().map(String::as_str).collect::<Vec<_>>())
        .env("CANARY", secret)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut output = Vec::new();
    for line in lines.by_ref() {
        let line = line.expect("line");
        let scan = line.contains("scan-now");
        output.push(line);
        if scan {
            break;
        }
    }
    // The step is running and holds the secret in its environment: no command line may.
    let holders: Vec<_> = command_lines().into_iter().filter(|(_, line)| line.contains(secret)).collect();
    std::fs::write(&proceed, "").expect("let the step finish");
    output.extend(lines.map_while(Result::ok));
    let status = child.wait().expect("wait");
    assert!(holders.is_empty(), "a command line holds the secret: {holders:?}");
    assert_eq!(status.code(), Some(0), "{output:?}");
    let text = output.join("\n");
    assert!(!text.contains(secret), "the secret leaked into the log: {text}");
    assert!(!text.contains("canary-7f3a9c-value"), "{text}");

    assert!(text.contains("and the whole: ***"), "the whole value is masked: {text}");
    assert!(text.contains("first half ***"), "the value split across two writes is masked: {text}");
}

#[test]
fn a_secret_not_given_is_named_in_the_log_and_not_passed() {
    let repo = Repo::new();
    repo.workflow(
        "ask",
        "steps:\n  - name: want\n    secrets: [MISSING_TOKEN]\n    run: echo \"value=[${MISSING_TOKEN-}]\"\n",
    );
    let run = run_shell(&repo, &[]);
    assert_eq!(run.code, Some(0), "{}", run.both());
    assert!(
        run.stdout.contains("secret MISSING_TOKEN is not granted to this run; step want runs without it"),
        "{}",
        run.both()
    );
    assert!(run.stdout.contains("ask/want | value=[]"), "{}", run.both());
}

#[test]
fn a_bad_workflow_names_file_line_and_column_and_the_others_still_run() {
    let repo = Repo::new();
    repo.workflow("bad", "steps:\n  - name: x\n    run: echo hi\n    timeout: forever\n");
    repo.workflow("good", "steps:\n  - name: ok\n    run: echo good\n");
    let run = run_shell(&repo, &[]);
    assert_eq!(run.code, Some(1), "{}", run.both());
    assert!(run.stderr.contains("error: .knotless/workflows/bad.yml:4:"), "{}", run.both());
    assert!(run.stderr.contains("steps[0].timeout"), "{}", run.both());
    assert!(run.stdout.contains("good: success"), "{}", run.both());
}

#[test]
fn rev_runs_the_commit_not_the_working_tree_and_outputs_come_back() {
    let repo = Repo::new();
    repo.write("message.txt", "committed\n");
    repo.workflow(
        "show",
        "steps:\n  - name: cat\n    run: cat message.txt; cp message.txt \"$KNOTLESS_RUN_OUTPUTS/copy.txt\"\n",
    );
    let commit = repo.commit("first");
    repo.write("message.txt", "edited, not committed\n");
    let outputs = tempfile::tempdir().expect("tempdir");
    let outputs_arg = outputs.path().display().to_string();
    let run = run_shell(&repo, &["--rev", "HEAD", "--outputs", &outputs_arg]);
    assert_eq!(run.code, Some(0), "{}", run.both());
    assert!(run.stdout.contains("show/cat | committed"), "{}", run.both());
    assert!(run.stdout.contains(&commit), "the run names its commit\n{}", run.both());
    let copied = std::fs::read_to_string(outputs.path().join("show/copy.txt")).expect("the output came back");
    assert_eq!(copied, "committed\n");
    let tree = run_shell(&repo, &["--outputs", &outputs_arg]);
    assert!(tree.stdout.contains("show/cat | edited, not committed"), "{}", tree.both());
}

#[test]
fn a_commit_that_cannot_be_packed_whole_is_an_error_and_no_step_runs() {
    let repo = Repo::new();
    repo.workflow("ci", "steps:\n  - name: look\n    run: ls -la; echo ran\n");
    // 1 MiB that git sends before it reaches the blob it cannot read.
    repo.write("a.txt", &"first file\n".repeat(100_000));
    repo.write("z.txt", "a blob that will be lost\n");
    repo.commit("first");
    let blob = repo.git(&["rev-parse", "HEAD:z.txt"]);
    let blob = blob.trim();
    std::fs::remove_file(repo.path().join(".git/objects").join(&blob[..2]).join(&blob[2..])).expect("remove the blob");
    let run = run_shell(&repo, &["--rev", "HEAD"]);
    assert_eq!(run.code, Some(1), "{}", run.both());
    assert_eq!(row(&run.stdout, "ci", "look")[..4], ["ci", "skipped", "look", "-"], "{}", run.both());
    assert!(run.stdout.contains("\nci: error: cannot pack the checkout: git archive"), "{}", run.both());
    assert!(!run.stdout.contains("ran"), "the step ran on a partial checkout\n{}", run.both());
}

#[test]
fn a_rust_crates_tests_pass_through_the_shell_executor_with_no_environment_workaround() {
    let repo = Repo::new();
    repo.write("Cargo.toml", "[package]\nname = \"tiny\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\n");
    repo.write(
        "src/lib.rs",
        "/// Adds.\n///\n/// ```\n/// assert_eq!(tiny::add(2, 2), 4);\n/// ```\npub fn add(a: u32, b: u32) -> u32 {\n    a + b\n}\n\n#[test]\nfn adds() {\n    assert_eq!(add(1, 2), 3);\n}\n",
    );
    repo.write(".gitignore", "target/\n");
    repo.workflow("test", "steps:\n  - name: cargo\n    run: cargo test --offline\n");
    let run = run_shell(&repo, &[]);
    assert_eq!(run.code, Some(0), "{}", run.both());
    assert_eq!(row(&run.stdout, "test", "cargo")[..4], ["test", "success", "cargo", "0"], "{}", run.both());
    assert!(run.stdout.contains("test adds ... ok"), "{}", run.both());
    assert!(run.stdout.contains("src/lib.rs - add (line 3) ... ok"), "the doc test ran\n{}", run.both());
}

#[test]
fn env_and_env_file_reach_every_step_under_the_workflows_own_env() {
    let repo = Repo::new();
    repo.workflow(
        "show",
        "env:\n  FROM_WORKFLOW: workflow\nsteps:\n  - name: print\n    run: echo \"$FROM_FILE/$FROM_FLAG/$FROM_HERE/$FROM_WORKFLOW/$HOME\"\n",
    );
    let scratch = tempfile::tempdir().expect("tempdir");
    let file = scratch.path().join("vars.env");
    std::fs::write(&file, "# settings\n\nFROM_FILE=file=value\nFROM_FLAG=overridden\nFROM_WORKFLOW=file\n")
        .expect("write");
    let work = tempfile::tempdir().expect("tempdir");
    let mut args = shell_args(&repo, work.path());
    args.extend(["--env-file".into(), file.display().to_string(), "--env".into(), "FROM_FLAG=flag".into()]);
    args.extend(["--env".into(), "FROM_HERE".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut command = knotless_run(&args);
    command.env("FROM_HERE", "here").env("HOME", scratch.path());
    let run = ran(command);
    assert_eq!(run.code, Some(0), "{}", run.both());
    let expected = format!("show/print | file=value/flag/here/workflow/{}", scratch.path().display());
    assert!(run.stdout.contains(&expected), "{expected}\n{}", run.both());
    for (flags, said) in [
        (vec!["--env", "KNOTLESS_COMMIT=x"], "--env KNOTLESS_COMMIT=x: KNOTLESS_COMMIT is set by the run itself"),
        (
            vec!["--env", "NOT_SET_ANYWHERE_42"],
            "--env NOT_SET_ANYWHERE_42: the variable NOT_SET_ANYWHERE_42 is not set",
        ),
        (vec!["--env", "1BAD=x"], "is not a variable name"),
    ] {
        let mut args = shell_args(&repo, work.path());
        args.extend(flags.iter().map(|flag| flag.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let refused = ran(knotless_run(&args));
        assert_eq!(refused.code, Some(2), "{}", refused.both());
        assert!(refused.stderr.contains(said), "{said}\n{}", refused.both());
    }
    std::fs::write(&file, "GOOD=1\nno equals sign\n").expect("write");
    let mut args = shell_args(&repo, work.path());
    args.extend(["--env-file".into(), file.display().to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let refused = ran(knotless_run(&args));
    assert_eq!(refused.code, Some(2), "{}", refused.both());
    assert!(refused.stderr.contains(", line 2: expected NAME=VALUE"), "{}", refused.both());
}

#[test]
fn on_a_terminal_statuses_are_coloured_unless_no_color_and_logs_are_one_text_warning() {
    let repo = Repo::new();
    // A step that says what it was told of colours and terminals, and prints a colour and a
    // screen clear.
    repo.workflow(
        "ci",
        "steps:\n  - name: pass\n    run: |\n      echo fine\n      \
         echo \"force=${CLICOLOR_FORCE:-}/${FORCE_COLOR:-} term=${TERM:-none}\"\n      \
         printf '\\033[31mred\\033[0m \\033[2Jclear\\n'\n",
    );
    let work = tempfile::tempdir().expect("tempdir");
    let args = shell_args(&repo, work.path());
    let line = std::iter::once(knotless_tests::bin("knotless-run").display().to_string())
        .chain(args.iter().map(|arg| format!("'{arg}'")))
        .collect::<Vec<_>>()
        .join(" ");
    // `script` gives the run a terminal (a pty) for stdout and stderr.
    let on_terminal = |no_color: Option<&str>| {
        let mut command = std::process::Command::new("script");
        command.args(["-qec", &line, "/dev/null"]).env_remove("NO_COLOR").env_remove("KNOTLESS_LOG");
        command.env("TERM", "xterm-256color");
        if let Some(value) = no_color {
            command.env("NO_COLOR", value);
        }
        ran(command)
    };
    let coloured = on_terminal(None);
    assert_eq!(coloured.code, Some(0), "{}", coloured.both());
    assert!(coloured.stdout.contains("\x1b[32msuccess"), "{:?}", coloured.stdout);
    assert!(coloured.stdout.contains("\x1b[36mci ==> "), "notes stand apart: {:?}", coloured.stdout);
    // The step is told to colour, is not told of a terminal it does not have, and its colour
    // reaches the terminal, reset at the line's end; its screen clear does not.
    assert!(coloured.stdout.contains("ci/pass | force=1/1 term=none"), "{:?}", coloured.stdout);
    assert!(coloured.stdout.contains("ci/pass | \x1b[31mred\x1b[0m \\x1b[2Jclear\x1b[0m"), "{:?}", coloured.stdout);
    let plain = on_terminal(Some("1"));
    assert_eq!(plain.code, Some(0), "{}", plain.both());
    assert!(!plain.stdout.contains('\x1b'), "an escape under NO_COLOR: {:?}", plain.stdout);
    assert!(plain.stdout.contains("ci: success in "), "{}", plain.both());
    assert!(plain.stdout.contains("ci/pass | force=/ term=none"), "{}", plain.both());
    assert!(plain.stdout.contains("ci/pass | \\x1b[31mred\\x1b[0m \\x1b[2Jclear"), "{}", plain.both());
    // Not on a terminal, with the default log filter: no JSON log lines among the output, and
    // the shell warning once.
    let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut command = knotless_run(&arg_refs);
    command.env_remove("KNOTLESS_LOG").env("TERM", "xterm-256color");
    let piped = ran(command);
    assert_eq!(piped.code, Some(0), "{}", piped.both());
    assert!(!piped.stdout.contains('\x1b') && !piped.stderr.contains('\x1b'), "{:?}", piped.both());
    assert!(!piped.stderr.contains("{\"timestamp\""), "JSON logs in a run's output:\n{}", piped.stderr);
    assert_eq!(piped.stderr.matches("isolates nothing").count(), 1, "{}", piped.stderr);
    assert!(piped.stdout.contains("ci/pass | force=/ term=none"), "{}", piped.both());
    let forced = run_shell(&repo, &["--color", "always"]);
    assert!(forced.stdout.contains("\x1b[32msuccess"), "{:?}", forced.stdout);
    assert!(forced.stdout.contains("ci/pass | force=1/1 term=none"), "{:?}", forced.stdout);
}

#[test]
fn branch_runs_as_if_on_that_branch_and_a_skip_names_the_filter() {
    let repo = Repo::new();
    repo.workflow(
        "release",
        "on:\n  push: { branches: [main, \"release/*\"] }\nsteps:\n  - name: ref\n    run: echo \"ref=$KNOTLESS_REF\"\n",
    );
    repo.commit("first");
    repo.git(&["checkout", "-q", "-b", "feature"]);
    // Nothing ran: no pass.
    let skipped = run_shell(&repo, &[]);
    assert_eq!(skipped.code, Some(1), "{}", skipped.both());
    assert!(
        skipped
            .stdout
            .contains("release ==> skipped: on.push.branches is [main, release/*], and this is branch feature"),
        "{}",
        skipped.both()
    );
    let as_main = run_shell(&repo, &["--branch", "release/2.0"]);
    assert_eq!(as_main.code, Some(0), "{}", as_main.both());
    assert!(as_main.stdout.contains("release/ref | ref=refs/heads/release/2.0"), "{}", as_main.both());
    let bad = run_shell(&repo, &["--branch", "two..dots"]);
    assert_eq!(bad.code, Some(2), "{}", bad.both());
    assert!(bad.stderr.contains("--branch two..dots: not a valid branch name"), "{}", bad.both());
}

/// Every live process on the host whose environment or command line holds `value`.
fn holding(value: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        for file in ["environ", "cmdline"] {
            if let Ok(bytes) = std::fs::read(entry.path().join(file))
                && bytes.windows(value.len()).any(|window| window == value.as_bytes())
            {
                found.push(format!("{}/{file}", entry.path().display()));
            }
        }
    }
    found
}

#[test]
fn no_process_of_a_secret_step_outlives_it_on_the_host_however_it_hides() {
    let indent = |script: &str| script.lines().map(|line| format!("      {line}\n")).collect::<String>();
    let hide = include_str!("../../scripts/hide.sh");
    // Of this test process only: the check scans the whole host.
    let secret = format!("e2e-hidden-s3cret-{}", std::process::id());
    let check = format!(
        "printf '%s%s' 'e2e-hidden-' '{}' > needle\n{}",
        secret.trim_start_matches("e2e-hidden-"),
        include_str!("../../scripts/holders.sh")
    );
    let repo = Repo::new();
    repo.workflow(
        "hide",
        &format!(
            "steps:\n  - name: hide\n    secrets: [TOKEN]\n    run: |\n{}  - name: check\n    run: |\n{}",
            indent(hide),
            indent(&check)
        ),
    );
    let work = tempfile::tempdir().expect("tempdir");
    let mut args = shell_args(&repo, work.path());
    args.extend(["--secret".to_string(), "TOKEN".to_string()]);
    let child = knotless_run(&args.iter().map(String::as_str).collect::<Vec<_>>())
        .env("TOKEN", &secret)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // The runner was given the secret in its environment by its user: that copy is the user's.
    let runner = format!("/proc/{}/environ", child.id());
    let output = child.wait_with_output().expect("wait");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("killed 5 process(es) step hide left running"), "{stdout}");
    let checked: Vec<&str> =
        stdout.lines().filter(|line| line.starts_with("hide/check | ") && !line.ends_with(&runner)).collect();
    assert_eq!(checked, ["hide/check | checked"], "{stdout}");
    assert_eq!(holding(&secret), Vec::<String>::new());
}

#[test]
fn a_mistyped_subcommand_is_refused_and_makes_nothing() {
    let place = tempfile::tempdir().expect("tempdir");
    let state = place.path().join("state");
    let state_flag = state.display().to_string();
    for (args, hint) in [
        (vec!["version"], "for the version, knotless-run --version"),
        (vec!["rnu", "--executor", "shell"], "did you mean knotless-run run?"),
        (vec!["chekcs"], "did you mean knotless-run checks?"),
        (vec!["completion", "bash"], "did you mean knotless-run completions?"),
        (
            vec!["zzz"],
            "the subcommands are run, plugin, checks, logs, notify, trigger, rerun, secrets, kubeconfig, cache, completions",
        ),
        (vec!["triger", "x", "y"], "did you mean knotless-run trigger?"),
        (vec!["reurn", "x", "y"], "did you mean knotless-run rerun?"),
        (vec!["cahce", "list"], "did you mean knotless-run cache?"),
        (vec!["a\u{1b}[2Jb"], "\"a\\x1b[2Jb\" is not"),
    ] {
        let mut args = args.clone();
        args.extend(["--state", &state_flag]);
        let started = std::time::Instant::now();
        let run = ran(knotless_run(&args));
        assert_eq!(run.code, Some(2), "{args:?}: {}", run.both());
        assert!(run.stderr.contains("is not a repository") && run.stderr.contains(hint), "{hint}\n{}", run.both());
        assert!(!run.stderr.contains('\u{1b}'), "{:?}", run.stderr);
        assert!(started.elapsed() < std::time::Duration::from_secs(1), "{args:?} took {:?}", started.elapsed());
        assert!(!state.exists(), "{args:?} made the state folder");
    }
}

#[test]
fn run_in_a_subfolder_runs_the_repository_and_no_workflow_is_no_pass() {
    let repo = Repo::new();
    repo.workflow("hello", "steps:\n  - name: hi\n    run: echo from the root\n");
    let sub = repo.path().join("src/deep");
    std::fs::create_dir_all(&sub).expect("mkdir");
    let work = tempfile::tempdir().expect("tempdir");
    let work_dir = format!("work-dir={}", work.path().display());
    let sub_path = sub.display().to_string();
    let run = ran(knotless_run(&["run", &sub_path, "--executor", "shell", "--executor-option", &work_dir]));
    assert_eq!(run.code, Some(0), "{}", run.both());
    assert!(run.stdout.contains("hello/hi | from the root"), "{}", run.both());
    // A folder of the work tree with workflows of its own is a repository of its own.
    let nested = repo.path().join("examples/demo");
    std::fs::create_dir_all(nested.join(".knotless/workflows")).expect("mkdir");
    std::fs::write(nested.join(".knotless/workflows/demo.yml"), "steps:\n  - name: hi\n    run: echo from the demo\n")
        .expect("write");
    std::fs::create_dir_all(nested.join("src")).expect("mkdir");
    let nested_path = nested.join("src").display().to_string();
    let run = ran(knotless_run(&["run", &nested_path, "--executor", "shell", "--executor-option", &work_dir]));
    assert_eq!(run.code, Some(0), "{}", run.both());
    assert!(run.stdout.contains("demo/hi | from the demo") && !run.stdout.contains("from the root"), "{}", run.both());

    let empty = tempfile::tempdir().expect("tempdir");
    let empty_path = empty.path().display().to_string();
    let run = ran(knotless_run(&["run", &empty_path, "--executor", "shell", "--executor-option", &work_dir]));
    assert_eq!(run.code, Some(2), "{}", run.both());
    assert!(
        run.stderr.contains("no workflows in") && run.stderr.contains(".knotless/workflows/NAME.yml"),
        "{}",
        run.both()
    );
}

/// The guarantee the reference gives for a step's two streams: each keeps its order, and
/// writes made apart in time reach the terminal in the order made, alternating as written.
#[test]
fn stdout_and_stderr_written_apart_in_time_arrive_in_the_order_written() {
    let repo = Repo::new();
    repo.workflow(
        "ci",
        "steps:\n  - name: both\n    run: |\n      for n in 1 2 3 4 5 6; do echo \"out-$n\"; sleep 0.1; echo \"err-$n\" >&2; sleep 0.1; done\n",
    );
    let run = run_shell(&repo, &[]);
    assert_eq!(run.code, Some(0), "{}", run.both());
    let lines: Vec<&str> = run.stdout.lines().filter_map(|line| line.strip_prefix("ci/both | ")).collect();
    let expected: Vec<String> = (1..=6).flat_map(|n| [format!("out-{n}"), format!("err-{n}")]).collect();
    assert_eq!(lines, expected, "{}", run.both());
}
