//! The command line itself: shell completions and the manual page, `plugin check` taking what
//! its help lists, executor options named as they were given, and an executor that cannot be
//! found naming where it was looked for.

use std::process::Command;

use knotless_tests::{Repo, bin, knotless_run, ran};

/// The subcommands `--help` lists.
const SUBCOMMANDS: &[&str] = &["run", "plugin", "checks", "logs", "notify", "secrets", "kubeconfig", "completions"];

#[test]
fn completions_complete_every_subcommand_and_an_unknown_shell_is_refused() {
    let bash = ran(knotless_run(&["completions", "bash"]));
    assert_eq!(bash.code, Some(0), "{}", bash.both());
    for name in SUBCOMMANDS {
        assert!(bash.stdout.contains(&format!("knotless__run__subcmd__{name}")), "{name}\n{}", bash.both());
    }
    assert!(
        bash.stdout.contains("complete -F _knotless__run -o bashdefault -o default knotless-run"),
        "{}",
        bash.both()
    );
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let script = ran(knotless_run(&["completions", shell]));
        assert_eq!(script.code, Some(0), "{shell}\n{}", script.both());
        assert!(script.stdout.contains("kubeconfig") && script.stdout.contains("executor-plugin"), "{shell}");
    }
    for bad in [vec!["completions", "nope"], vec!["completions", "bash\n\u{1b}[2J"], vec!["completions"]] {
        let refused = ran(knotless_run(&bad));
        assert_eq!(refused.code, Some(2), "{bad:?}\n{}", refused.both());
        assert!(refused.stdout.is_empty(), "{bad:?}\n{}", refused.both());
    }
    let refused = ran(knotless_run(&["completions", "nope"]));
    assert!(
        refused.stderr.contains("invalid value 'nope'")
            && refused.stderr.contains("[possible values: bash, elvish, fish, powershell, zsh]"),
        "{}",
        refused.both()
    );
    let help = ran(knotless_run(&["completions", "--help"]));
    assert!(help.stdout.contains("[possible values: bash, elvish, fish, powershell, zsh]"), "{}", help.both());
    let help = ran(knotless_run(&["--help"]));
    assert!(help.stdout.contains("completions") && !help.stdout.contains("manpage"), "{}", help.both());
}

#[test]
fn the_manual_page_is_roff_naming_every_subcommand() {
    let page = ran(knotless_run(&["manpage"]));
    assert_eq!(page.code, Some(0), "{}", page.both());
    assert!(page.stdout.contains(".TH knotless-run 1") && page.stdout.contains(".SH SYNOPSIS"), "{}", page.both());
    for name in SUBCOMMANDS {
        assert!(page.stdout.contains(&format!("knotless\\-run\\-{name}(1)")), "{name}\n{}", page.both());
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let pages = ran(knotless_run(&["manpage", "--dir", &dir.path().display().to_string()]));
    assert_eq!(pages.code, Some(0), "{}", pages.both());
    assert_eq!(pages.stdout.lines().next(), Some(dir.path().join("knotless-run.1").display().to_string().as_str()));
    let written = std::fs::read_to_string(dir.path().join("knotless-run.1")).expect("knotless-run.1");
    assert!(written == page.stdout, "the page in --dir is not the one printed:\n{written}\n---\n{}", page.stdout);
    assert!(!written.contains("knotless\\-run\\-help(1)"), "a page names a help page that is not written");
    let check = std::fs::read_to_string(dir.path().join("knotless-run-plugin-check.1")).expect("a subcommand's page");
    assert!(check.contains("\\-\\-executor\\-plugin"), "{check}");
    let missing = ran(knotless_run(&["manpage", "--dir", "/nonexistent/\nfolder"]));
    assert_eq!(missing.code, Some(2), "{}", missing.both());
    assert!(missing.stderr.contains("--dir /nonexistent/\\nfolder: not a folder"), "{}", missing.both());
}

#[test]
fn plugin_check_takes_the_executor_every_way_its_help_lists() {
    let help = ran(knotless_run(&["plugin", "check", "--help"]));
    assert!(help.stdout.contains("--executor <NAME>") && help.stdout.contains("--executor-plugin <PATH>"));
    // By name, found beside knotless-run as a run finds it.
    let by_name = ran(knotless_run(&["plugin", "check", "--executor", "fake", "--executor-grace", "1"]));
    assert_eq!(by_name.code, Some(0), "{}", by_name.both());
    let fake = bin("knotless-executor-fake").display().to_string();
    assert!(by_name.stdout.starts_with(&format!("plugin check {fake}\n")), "{}", by_name.both());
    assert!(by_name.stdout.contains(" passed, 0 failed"), "{}", by_name.both());
    let by_flag = ran(knotless_run(&["plugin", "check", "--executor-plugin", &fake, "--executor-grace", "1"]));
    assert_eq!(by_flag.code, Some(0), "{}", by_flag.both());
    // Exactly one of the three.
    for args in [
        vec!["plugin", "check"],
        vec!["plugin", "check", &fake, "--executor", "fake"],
        vec!["plugin", "check", &fake, "--executor-plugin", &fake],
        vec!["plugin", "check", "--executor", "fake", "--executor-plugin", &fake],
        vec!["plugin", "check", "--executor"],
    ] {
        let refused = ran(knotless_run(&args));
        assert_eq!(refused.code, Some(2), "{args:?}\n{}", refused.both());
        assert!(refused.stdout.is_empty(), "{args:?}\n{}", refused.both());
    }
    let not_a_program = ran(knotless_run(&["plugin", "check", "/nonexistent\u{1b}[2J"]));
    assert_eq!(not_a_program.code, Some(2), "{}", not_a_program.both());
    assert!(not_a_program.stderr.contains("/nonexistent\\x1b[2J: not an executable file"), "{}", not_a_program.both());
}

/// `run` of a one-step repository with the shell executor and `extra` flags.
fn run_shell(extra: &[&str]) -> knotless_tests::Ran {
    let repo = Repo::new();
    repo.workflow("ci", "steps:\n  - name: s\n    run: 'true'\n");
    let work = tempfile::tempdir().expect("tempdir");
    let repo = repo.path().display().to_string();
    let work_dir = format!("work-dir={}", work.path().display());
    let mut args = vec!["run", repo.as_str(), "--executor", "shell", "--executor-option", work_dir.as_str()];
    args.extend_from_slice(extra);
    ran(knotless_run(&args))
}

#[test]
fn an_unknown_executor_option_is_named_as_it_was_given() {
    let option = run_shell(&["--executor-option", "foo=bar"]);
    assert_eq!(option.code, Some(2), "{}", option.both());
    let expected = "knotless-run: executor shell refused its configuration: unknown option --executor-option foo=... \
                    for the shell executor\n";
    assert!(option.stderr.ends_with(expected), "{}", option.both());
    assert!(!option.stderr.contains("--foo"), "{}", option.both());
    // From its own flag, it is that flag.
    let flag = run_shell(&["--namespace", "ns"]);
    assert_eq!(flag.code, Some(2), "{}", flag.both());
    assert!(flag.stderr.contains("unknown option --namespace for the shell executor"), "{}", flag.both());
    // A hostile key: named whole, escaped.
    let hostile = run_shell(&["--executor-option", "e\n\u{1b}[2J=1"]);
    assert_eq!(hostile.code, Some(2), "{}", hostile.both());
    let last = hostile.stderr.lines().last().unwrap_or_default();
    assert!(
        last.ends_with("unknown option --executor-option e\\n\\x1b[2J=... for the shell executor"),
        "{}",
        hostile.both()
    );
    assert!(!hostile.stderr.contains('\u{1b}'), "a raw escape reached the terminal\n{}", hostile.both());
    // The same through plugin check's handshake.
    let work = tempfile::tempdir().expect("tempdir");
    let shell = bin("knotless-executor-shell").display().to_string();
    let work_dir = format!("work-dir={}", work.path().display());
    let check =
        ran(knotless_run(&["plugin", "check", &shell, "--executor-option", &work_dir, "--executor-option", "foo=x"]));
    assert_eq!(check.code, Some(1), "{}", check.both());
    let handshake = check.stdout.lines().find(|line| line.starts_with("  FAIL     handshake (")).unwrap_or_default();
    assert!(
        handshake.ends_with(
            " ms): executor shell refused its configuration: unknown option --executor-option foo=... \
                             for the shell executor"
        ),
        "{}",
        check.both()
    );
}

#[test]
fn a_runner_copied_alone_names_where_it_looked_for_the_shell_executor_and_the_fix() {
    let alone = tempfile::tempdir().expect("tempdir");
    let runner = alone.path().join("knotless-run");
    std::fs::copy(bin("knotless-run"), &runner).expect("copy knotless-run alone");
    let plugins = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new();
    repo.workflow("ci", "steps:\n  - name: s\n    run: 'true'\n");
    let run = |executor: &str| {
        ran({
            let mut command = Command::new(&runner);
            command.args(["run", &repo.path().display().to_string(), "--executor", executor, "--plugin-dir"]);
            command.arg(plugins.path()).env("PATH", "/usr/bin:/bin").env("KNOTLESS_LOG", "warn");
            command
                .env("XDG_CONFIG_HOME", alone.path().join("config"))
                .env("XDG_CACHE_HOME", alone.path().join("cache"));
            command
        })
    };
    let shell = run("shell");
    assert_eq!(shell.code, Some(2), "{}", shell.both());
    let plugins = plugins.path().display().to_string();
    for said in [
        "no executor \"shell\": looked for knotless-executor-shell".to_string(),
        format!("beside knotless-run in {}", alone.path().display()),
        format!("in --plugin-dir {plugins} (as shell or knotless-executor-shell)"),
        "on PATH (/usr/bin:/bin)".to_string(),
        "`make install` (from the source) puts it in /usr/libexec/knotless".to_string(),
        "--executor-plugin PATH".to_string(),
    ] {
        assert!(shell.stderr.contains(&said), "{said}\n{}", shell.both());
    }
    let hostile = run("sh\nell\u{1b}[2J");
    assert_eq!(hostile.code, Some(2), "{}", hostile.both());
    assert!(hostile.stderr.contains("looked for knotless-executor-sh\\nell\\x1b[2J"), "{}", hostile.both());
    assert!(!hostile.stderr.contains('\u{1b}') && !hostile.stderr.contains("make install"), "{}", hostile.both());
}
