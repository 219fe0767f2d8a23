//! `knotless-run run` as a tool on a laptop: caches kept per repository, workflows side by
//! side with `--jobs`, the defaults files, and a transfer's progress on a terminal.

use std::path::Path;

use knotless_tests::{Repo, knotless_run, ran};

/// `run` of `repo` through the shell executor with `extra` flags, its cache and config
/// folders given, and nothing left in its work folder.
fn run_in(repo: &Repo, cache: &Path, config: &Path, extra: &[&str]) -> knotless_tests::Ran {
    crate::run_shell_with(repo, extra, &[("XDG_CACHE_HOME", cache), ("XDG_CONFIG_HOME", config)])
}

/// A step that says what its cache held, then writes `value` into it and exits `code`.
fn cached_workflow(value: &str, code: u8) -> String {
    format!(
        "on: [push, pull]\ncache: [deps]\nsteps:\n  - name: use\n    run: |\n      echo \"held=$(cat deps/value 2>/dev/null || echo nothing)\"\n      mkdir -p deps && echo {value} > deps/value\n      exit {code}\n"
    )
}

#[test]
fn caches_are_kept_per_repository_promoted_only_by_a_passing_push_and_skipped_with_no_cache() {
    let (cache, config) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    let run = |repo: &Repo, extra: &[&str]| run_in(repo, cache.path(), config.path(), extra);
    let repo = Repo::new();
    repo.workflow("build", &cached_workflow("one", 0));
    let first = run(&repo, &[]);
    assert_eq!(first.code, Some(0), "{}", first.both());
    assert!(first.stdout.contains("build/use | held=nothing"), "{}", first.both());
    assert!(first.stdout.contains("build ==> cache deps (started cold): promoted ("), "{}", first.both());

    let second = run(&repo, &[]);
    assert!(second.stdout.contains("build/use | held=one"), "the pass kept its layer:\n{}", second.both());
    assert!(second.stdout.contains("build ==> cache deps: warm ("), "{}", second.both());

    // A failing run's layer is dropped: the next run still holds what the last pass kept.
    repo.workflow("build", &cached_workflow("broken", 1));
    let failed = run(&repo, &[]);
    assert_eq!(failed.code, Some(1), "{}", failed.both());
    assert!(failed.stdout.contains("dropped (the run did not pass)"), "{}", failed.both());
    repo.workflow("build", &cached_workflow("two", 0));
    let after = run(&repo, &[]);
    assert!(after.stdout.contains("build/use | held=one"), "{}", after.both());

    // A pull reads the apart base (none) and keeps nothing.
    let pull = run(&repo, &["--event", "pull"]);
    assert!(pull.stdout.contains("build/use | held=nothing"), "{}", pull.both());
    assert!(pull.stdout.contains("dropped (untrusted run)"), "{}", pull.both());
    let again = run(&repo, &[]);
    assert!(again.stdout.contains("build/use | held=two"), "{}", again.both());

    // --no-cache restores nothing and keeps nothing.
    let off = run(&repo, &["--no-cache"]);
    assert_eq!(off.code, Some(0), "{}", off.both());
    assert!(off.stdout.contains("build/use | held=nothing"), "{}", off.both());
    assert!(off.stdout.contains("caches off (--no-cache)"), "{}", off.both());
    let kept = run(&repo, &[]);
    assert!(kept.stdout.contains("build/use | held=two"), "--no-cache kept nothing:\n{}", kept.both());

    // Another repository's workflow of the same name has a cache of its own.
    let other = Repo::new();
    other.workflow("build", &cached_workflow("other", 0));
    let apart = run(&other, &[]);
    assert!(apart.stdout.contains("build/use | held=nothing"), "{}", apart.both());
    // Every layer a run brought back was settled: none is left in the cache folder.
    let upper = cache.path().join("knotless/caches/.upper");
    let left: Vec<_> = std::fs::read_dir(&upper).into_iter().flatten().flatten().map(|entry| entry.path()).collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn jobs_runs_workflows_side_by_side_and_never_splits_a_line() {
    let (cache, config) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    let meet = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new();
    // Each of the two waits (up to 20 s) for the other to start: they pass together only
    // when they run at the same time. Both write lines long enough to cross write buffers.
    let waiting = |me: &str, other: &str| {
        format!(
            "steps:\n  - name: meet\n    run: |\n      touch \"$MEET/{me}\"\n      i=0\n      while [ ! -e \"$MEET/{other}\" ]; do i=$((i+1)); [ $i -gt 200 ] && exit 9; sleep 0.1; done\n      yes {me}-0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz | head -n 20000\n"
        )
    };
    repo.workflow("left", &waiting("left", "right"));
    repo.workflow("right", &waiting("right", "left"));
    let meet_env = format!("MEET={}", meet.path().display());
    let side_by_side = run_in(&repo, cache.path(), config.path(), &["--jobs", "2", "--env", &meet_env]);
    assert_eq!(side_by_side.code, Some(0), "{}", side_by_side.both());
    let mut counts = [0, 0];
    for line in side_by_side.stdout.lines().filter(|line| line.contains(" | ")) {
        let whole = |me: &str| {
            format!("{me}/meet | {me}-0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz")
        };
        if line == whole("left") {
            counts[0] += 1;
        } else if line == whole("right") {
            counts[1] += 1;
        } else {
            panic!("a line split or mixed: {line:?}");
        }
    }
    assert_eq!(counts, [20000, 20000]);
    for workflow in ["left", "right"] {
        assert!(side_by_side.stdout.contains(&format!("{workflow}: success in")), "{}", side_by_side.both());
    }

    // One at a time, the first waits for the second in vain.
    std::fs::remove_dir_all(meet.path()).expect("clear");
    std::fs::create_dir(meet.path()).expect("mkdir");
    let one_by_one = run_in(&repo, cache.path(), config.path(), &["--env", &meet_env]);
    assert_eq!(one_by_one.code, Some(1), "{}", one_by_one.both());
    assert!(one_by_one.stdout.contains("left: failure"), "{}", one_by_one.both());

    let refused = run_in(&repo, cache.path(), config.path(), &["--jobs", "0"]);
    assert_eq!(refused.code, Some(2), "{}", refused.both());
    assert!(refused.stderr.contains("--jobs"), "{}", refused.both());
}

#[test]
fn the_defaults_files_give_executor_env_and_jobs_and_flags_win() {
    let (cache, config) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    let outputs = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new();
    repo.workflow(
        "show",
        "steps:\n  - name: env\n    run: |\n      echo \"from=$FROM user=$USER_ONLY\"\n      echo out > \"$KNOTLESS_RUN_OUTPUTS/file\"\n",
    );
    std::fs::create_dir_all(config.path().join("knotless")).expect("mkdir");
    std::fs::write(
        config.path().join("knotless/run.toml"),
        format!("outputs = \"{}\"\n[env]\nFROM = \"user\"\nUSER_ONLY = \"mine\"\n", outputs.path().display()),
    )
    .expect("write");
    repo.write(".knotless/run.toml", "jobs = 2\n[env]\nFROM = \"repository\"\n");
    let defaults = run_in(&repo, cache.path(), config.path(), &[]);
    assert_eq!(defaults.code, Some(0), "{}", defaults.both());
    assert!(defaults.stdout.contains("show/env | from=repository user=mine"), "{}", defaults.both());
    assert!(outputs.path().join("show/file").is_file(), "outputs go where the user's file says\n{}", defaults.both());

    let flags = run_in(&repo, cache.path(), config.path(), &["--env", "FROM=flag"]);
    assert!(flags.stdout.contains("show/env | from=flag user=mine"), "{}", flags.both());

    // The repository's file names an executor: without --executor it is the one looked for
    // (and not installed here); --executor shell wins over it.
    repo.write(".knotless/run.toml", "executor = \"nowhere\"\n");
    let path = repo.path().display().to_string();
    let mut named = knotless_run(&["run", &path]);
    named.env("XDG_CACHE_HOME", cache.path()).env("XDG_CONFIG_HOME", config.path());
    let named = ran(named);
    assert_eq!(named.code, Some(2), "{}", named.both());
    assert!(named.stderr.contains("knotless-executor-nowhere"), "{}", named.both());
    let flag = run_in(&repo, cache.path(), config.path(), &[]);
    assert_eq!(flag.code, Some(0), "{}", flag.both());

    repo.write(".knotless/run.toml", "image = \"x\"\njbos = 3\n[env]\nFROM = \"x\"\n");
    let typo = run_in(&repo, cache.path(), config.path(), &[]);
    assert_eq!(typo.code, Some(2), "{}", typo.both());
    let file = repo.path().join(".knotless/run.toml").canonicalize().expect("canonical");
    let expected = format!("{}, line 2, column 1: unknown field `jbos`", file.display());
    assert!(typo.stderr.contains(&expected), "{expected}\n{}", typo.both());

    // A repository may not choose which folder a run empties.
    repo.write(".knotless/run.toml", "outputs = \"/home\"\n");
    let refused = run_in(&repo, cache.path(), config.path(), &[]);
    assert_eq!(refused.code, Some(2), "{}", refused.both());
    assert!(refused.stderr.contains("outputs: only your own"), "{}", refused.both());
}

#[test]
fn a_transfer_longer_than_a_second_shows_its_progress_on_a_terminal_only() {
    let repo = Repo::new();
    repo.workflow("ci", "steps:\n  - name: pass\n    run: echo fine\n");
    // 3 MiB the fake's slow link takes about three seconds to read.
    let noise: Vec<u8> = (0..3u32 << 20).map(|index| (index.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(repo.path().join("noise.bin"), noise).expect("write");
    let (cache, work) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    let fake = knotless_tests::bin("knotless-executor-fake").display().to_string();
    let args = [
        "run".to_string(),
        repo.path().display().to_string(),
        "--executor-plugin".into(),
        fake,
        "--executor-option".into(),
        "mode=slow-upload".into(),
        "--executor-option".into(),
        format!("work-dir={}", work.path().display()),
    ];
    let line = std::iter::once(knotless_tests::bin("knotless-run").display().to_string())
        .chain(args.iter().map(|arg| format!("'{arg}'")))
        .collect::<Vec<_>>()
        .join(" ");
    // `script` gives the run a terminal (a pty).
    let mut command = std::process::Command::new("script");
    command.args(["-qec", &line, "/dev/null"]).env("XDG_CACHE_HOME", cache.path()).env("NO_COLOR", "1");
    let shown = ran(command);
    assert_eq!(shown.code, Some(0), "{}", shown.both());
    assert!(shown.stdout.contains("\rci ==> checkout: "), "{:?}", shown.stdout);
    assert!(shown.stdout.contains(" MiB (") && shown.stdout.contains("/s)"), "{:?}", shown.stdout);
    assert!(!shown.stdout.contains('\x1b'), "no escape under NO_COLOR: {:?}", shown.stdout);
    // The progress line is blanked before the next line: the note after it starts clean.
    assert!(shown.stdout.contains("\rci ==> checked out "), "{:?}", shown.stdout);

    let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut piped = knotless_run(&arg_refs);
    piped.env("XDG_CACHE_HOME", cache.path());
    let piped = ran(piped);
    assert_eq!(piped.code, Some(0), "{}", piped.both());
    assert!(!piped.stdout.contains('\r') && !piped.stdout.contains("==> checkout: "), "{}", piped.both());
}

#[test]
fn a_step_starts_with_every_signal_at_its_default_whatever_knotless_run_was_started_ignoring() {
    let repo = Repo::new();
    // The step's own signal state, read with the shell's builtins (while a child of it runs,
    // `dash` may still hold every signal blocked from starting it), and its executor's (the
    // parent of its reaper, its parent).
    let script = "while read -r line; do case $line in SigBlk:*|SigIgn:*) echo \"$line\";; esac; done < /proc/$$/status\n      \
                  executor=$(cut -d' ' -f4 /proc/$PPID/stat)\n      \
                  echo \"executor $(grep '^SigIgn:' /proc/$executor/status)\"\n";
    repo.workflow("signals", &format!("steps:\n  - name: show\n    run: |\n      {script}"));
    let work = tempfile::tempdir().expect("tempdir");
    let plain = knotless_run(&[]);
    // As under `nohup` or `trap ''`: an ignored signal stays ignored across `exec`, so the
    // runner, its executor and the executor's reaper all start with HUP, INT and QUIT ignored.
    let mut command = std::process::Command::new("sh");
    command.args(["-c", "trap '' HUP INT QUIT; exec \"$@\"", "sh"]).arg(plain.get_program());
    command.args(crate::shell_args(&repo, work.path()));
    command.envs(plain.get_envs().filter_map(|(name, value)| Some((name, value?))));
    let run = ran(command);
    assert_eq!(run.code, Some(0), "{}", run.both());
    let executor = run
        .stdout
        .lines()
        .find_map(|line| line.strip_prefix("signals/show | executor SigIgn:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .unwrap_or_else(|| panic!("the executor's ignored signals\n{}", run.both()));
    assert_eq!(executor & 0b111, 0b111, "the executor did not start with HUP, INT and QUIT ignored\n{}", run.both());
    assert!(run.stdout.contains("signals/show | SigIgn:\t0000000000000000"), "{}", run.both());
    assert!(run.stdout.contains("signals/show | SigBlk:\t0000000000000000"), "{}", run.both());
}
