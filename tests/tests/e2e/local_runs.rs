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

    // Nor lower the isolation the user chose: the user's executor stands, and says so.
    std::fs::write(config.path().join("knotless/run.toml"), "executor = \"nowhere\"\n").expect("write");
    repo.write(".knotless/run.toml", "executor = \"shell\"\n");
    let path = repo.path().display().to_string();
    let mut lowered = knotless_run(&["run", &path]);
    lowered.env("XDG_CACHE_HOME", cache.path()).env("XDG_CONFIG_HOME", config.path());
    let lowered = ran(lowered);
    assert_eq!(lowered.code, Some(2), "the user's executor, not the repository's shell: {}", lowered.both());
    assert!(lowered.stderr.contains("knotless-executor-nowhere"), "{}", lowered.both());
    assert!(
        lowered.stderr.contains("asks for executor shell;") && lowered.stderr.contains("chose nowhere, which stands"),
        "{}",
        lowered.both()
    );

    // An image in a defaults file, under an executor that takes none: noted, and the run goes.
    std::fs::write(config.path().join("knotless/run.toml"), "image = \"rust:1.95\"\n").expect("write");
    repo.write(".knotless/run.toml", "jobs = 1\n");
    let image = run_in(&repo, cache.path(), config.path(), &[]);
    assert_eq!(image.code, Some(0), "{}", image.both());
    assert!(
        image.stdout.contains("show ==> image rust:1.95 ignored: executor shell does not take images"),
        "{}",
        image.both()
    );
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

/// `install-user.sh` into a prefix of a user's: the runner finds its executors in the prefix's
/// `libexec/knotless` with nothing on `PATH`; a runner copied elsewhere alone finds them through
/// `plugin-dir` of the user's run.toml, and never through a repository's.
#[test]
fn a_users_install_finds_its_executors_and_run_toml_may_say_where_they_are() {
    let dir = tempfile::tempdir().expect("tempdir");
    let prefix = dir.path().join("home/.local");
    let (cache, config, work) = (dir.path().join("cache"), dir.path().join("config"), dir.path().join("work"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/install-user.sh");
    let bin_dir = knotless_tests::bin_dir();
    let mut install = std::process::Command::new("bash");
    install.arg(&script).arg("--bin-dir").arg(&bin_dir).arg("--prefix").arg(&prefix).env("PATH", "/usr/bin:/bin");
    let installed = ran(install);
    assert_eq!(installed.code, Some(0), "{}", installed.both());
    for file in
        ["bin/knotless-run", "libexec/knotless/shell", "libexec/knotless/docker", "share/man/man1/knotless-run-run.1"]
    {
        assert!(prefix.join(file).is_file(), "no {file}:\n{}", installed.both());
    }
    assert!(installed.stderr.contains("bin is not on your PATH"), "{}", installed.both());

    let repo = Repo::new();
    repo.workflow("ci", "steps:\n  - name: go\n    run: echo installed-run\n");
    let work_dir = format!("work-dir={}", work.display());
    let run = |runner: &Path, repo: &Repo| {
        let mut command = std::process::Command::new(runner);
        command
            .args(["run", &repo.path().display().to_string(), "--executor-option", &work_dir])
            .env("PATH", "/usr/bin:/bin")
            .env("XDG_CACHE_HOME", &cache)
            .env("XDG_CONFIG_HOME", &config)
            .env_remove("KNOTLESS_LOG");
        ran(command)
    };
    let first = run(&prefix.join("bin/knotless-run"), &repo);
    assert_eq!(first.code, Some(0), "{}", first.both());
    assert!(first.stdout.contains("ci/go | installed-run"), "{}", first.both());

    // The runner alone elsewhere: not found, and the error names where it looked.
    let alone = dir.path().join("alone");
    std::fs::create_dir_all(&alone).expect("mkdir");
    std::fs::copy(prefix.join("bin/knotless-run"), alone.join("knotless-run")).expect("copy");
    let lost = run(&alone.join("knotless-run"), &repo);
    assert_eq!(lost.code, Some(2), "{}", lost.both());
    assert!(lost.stderr.contains("no executor \"shell\"") && lost.stderr.contains("install-user"), "{}", lost.both());
    // A repository cannot say where executors are.
    let hostile = Repo::new();
    hostile.workflow("ci", "steps:\n  - name: go\n    run: echo installed-run\n");
    std::fs::write(
        hostile.path().join(".knotless/run.toml"),
        format!("plugin-dir = \"{}\"\n", prefix.join("libexec/knotless").display()),
    )
    .expect("write");
    let refused = run(&alone.join("knotless-run"), &hostile);
    assert_eq!(refused.code, Some(2), "{}", refused.both());
    assert!(refused.stderr.contains("plugin-dir: only your own"), "{}", refused.both());
    // The user's run.toml can.
    std::fs::create_dir_all(config.join("knotless")).expect("mkdir");
    std::fs::write(
        config.join("knotless/run.toml"),
        format!("plugin-dir = \"{}\"\nisolation-warning = false\n", prefix.join("libexec/knotless").display()),
    )
    .expect("write");
    let found = run(&alone.join("knotless-run"), &repo);
    assert_eq!(found.code, Some(0), "{}", found.both());
    assert!(found.stdout.contains("ci/go | installed-run"), "{}", found.both());
    assert!(!found.stderr.contains("isolates nothing"), "the warning, once understood, is off: {}", found.both());
    assert!(first.stderr.contains("isolates nothing"), "{}", first.both());
    assert_eq!(crate::sessions_in(&work), Vec::<String>::new());
}

/// A cache is kept per executor and image: a host's build never lands in a container; `cache
/// list` shows each, and `cache prune` removes those of a workflow that is gone.
#[test]
fn caches_are_kept_per_executor_and_image_listed_and_pruned() {
    let (cache, config) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    let repo = Repo::new();
    repo.workflow("build", &cached_workflow("host", 0));
    let shell = run_in(&repo, cache.path(), config.path(), &[]);
    assert!(shell.stdout.contains("build/use | held=nothing"), "{}", shell.both());
    let path = repo.path().display().to_string();
    let in_docker = || {
        let mut command = knotless_run(&["run", &path, "--executor", "docker", "--image", "knotless-test/busybox:1"]);
        command.env("XDG_CACHE_HOME", cache.path()).env("XDG_CONFIG_HOME", config.path());
        ran(command)
    };
    let docker = in_docker();
    assert_eq!(docker.code, Some(0), "{}", docker.both());
    // The container is named once, by the environment's note.
    assert_eq!(docker.stdout.matches("build ==> environment: container ").count(), 1, "{}", docker.both());
    assert!(!docker.stdout.contains("build ==> container "), "said twice:\n{}", docker.both());
    assert!(docker.stdout.contains("build/use | held=nothing"), "not the host's cache:\n{}", docker.both());
    let again = in_docker();
    assert!(again.stdout.contains("build/use | held=host"), "its own:\n{}", again.both());
    let shell = run_in(&repo, cache.path(), config.path(), &[]);
    assert!(shell.stdout.contains("build/use | held=host"), "{}", shell.both());

    let cache_command = |args: &[&str]| {
        let mut command = knotless_run(&[&["cache"][..], args].concat());
        command.env("XDG_CACHE_HOME", cache.path()).current_dir(repo.path());
        ran(command)
    };
    let listed = cache_command(&["list"]);
    assert_eq!(listed.code, Some(0), "{}", listed.both());
    let rows: Vec<&str> = listed.stdout.lines().filter(|line| line.contains(" build ")).collect();
    assert_eq!(rows.len(), 2, "{}", listed.both());
    assert!(rows.iter().any(|row| row.contains(" shell ") && row.contains(" trusted ")), "{}", listed.both());
    assert!(
        rows.iter().any(|row| row.contains(" docker ") && row.contains("knotless-test_busybox_1")),
        "{}",
        listed.both()
    );
    assert!(listed.stdout.contains("2 cache(s), "), "{}", listed.both());

    // A workflow renamed: its caches are no one's.
    std::fs::remove_file(repo.path().join(".knotless/workflows/build.yml")).expect("rm");
    repo.workflow("compile", &cached_workflow("x", 0));
    let would = cache_command(&["prune", "--dry-run"]);
    assert_eq!(would.stdout.matches("would remove ").count(), 2, "{}", would.both());
    assert!(would.stdout.contains("no workflow build any more"), "{}", would.both());
    assert_eq!(cache_command(&["list"]).stdout.lines().filter(|line| line.contains(" build ")).count(), 2);
    let pruned = cache_command(&["prune"]);
    assert_eq!(pruned.code, Some(0), "{}", pruned.both());
    assert_eq!(pruned.stdout.matches("removed ").count(), 2, "{}", pruned.both());
    assert!(cache_command(&["list"]).stdout.starts_with("no cache in "), "everything of build went");
}

/// A cached folder holding a link that leaves it (a virtualenv's `bin/python3`) is not kept,
/// and the run says which link; one whose links stay inside comes back whole, links and all.
#[test]
fn a_cache_with_a_link_out_of_its_folder_is_not_kept_and_one_with_links_inside_round_trips() {
    let (cache, config) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    let repo = Repo::new();
    let workflow = |outside: bool| {
        format!(
            "cache: [.venv]\nsteps:\n  - name: use\n    run: |\n      \
             echo \"held=$(cat .venv/marker 2>/dev/null || echo nothing) inside=$(cat .venv/inside 2>/dev/null || echo none)\"\n      \
             mkdir -p .venv/bin && echo kept > .venv/marker && ln -sf marker .venv/inside\n      {}\n",
            if outside { "ln -sf /bin/sh .venv/bin/python3" } else { "ln -sf ../marker .venv/bin/python3" }
        )
    };
    repo.workflow("venv", &workflow(true));
    let broken = run_in(&repo, cache.path(), config.path(), &[]);
    assert_eq!(broken.code, Some(0), "{}", broken.both());
    assert!(
        broken.stdout.contains(
            "venv ==> cache .venv: not saved: the executor left bin/python3 (a symlink whose target leaves the folder) out of it"
        ),
        "{}",
        broken.both()
    );
    let next = run_in(&repo, cache.path(), config.path(), &[]);
    assert!(next.stdout.contains("venv/use | held=nothing inside=none"), "no half cache was kept:\n{}", next.both());

    repo.workflow("venv", &workflow(false));
    let whole = run_in(&repo, cache.path(), config.path(), &[]);
    assert!(whole.stdout.contains("venv ==> cache .venv (started cold): promoted ("), "{}", whole.both());
    let warm = run_in(&repo, cache.path(), config.path(), &[]);
    assert!(warm.stdout.contains("venv/use | held=kept inside=kept"), "{}", warm.both());
}

/// `--keep` leaves the environment and says how to remove it; `run --cleanup` removes it (and
/// only with `remove_kept` does a sweep take it: a plain run's sweep leaves it).
#[test]
fn kept_environments_stay_until_run_cleanup_removes_them() {
    let (cache, config, work) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    let repo = Repo::new();
    repo.workflow("ci", "steps:\n  - name: go\n    run: echo kept > left-here\n");
    let work_dir = format!("work-dir={}", work.path().display());
    let path = repo.path().display().to_string();
    let run = |extra: &[&str]| {
        let mut command = knotless_run(&[&["run", &path, "--executor-option", &work_dir][..], extra].concat());
        command.env("XDG_CACHE_HOME", cache.path()).env("XDG_CONFIG_HOME", config.path());
        ran(command)
    };
    let kept = run(&["--keep"]);
    assert_eq!(kept.code, Some(0), "{}", kept.both());
    assert!(kept.stdout.contains("`knotless-run run --cleanup` removes them"), "{}", kept.both());
    assert_eq!(crate::sessions_in(work.path()).len(), 1, "{}", kept.both());
    let plain = run(&[]);
    assert_eq!(plain.code, Some(0), "{}", plain.both());
    assert_eq!(crate::sessions_in(work.path()).len(), 1, "a plain run's sweep leaves a kept environment");
    let cleaned = run(&["--cleanup"]);
    assert_eq!(cleaned.code, Some(0), "{}", cleaned.both());
    assert!(
        cleaned.stdout.contains("removed folder ") && cleaned.stdout.contains("1 removed, 0 could not be"),
        "{}",
        cleaned.both()
    );
    assert_eq!(crate::sessions_in(work.path()), Vec::<String>::new());
}
