//! The deployment: `deploy/install.sh` and `deploy/uninstall.sh` into a temporary `DESTDIR`,
//! the systemd units through `systemd-analyze verify`, and the commands of
//! `docs/guide/kubernetes-runner.md` against the fake API server, with a `kubectl` on `PATH`
//! that fails the test if anything runs it.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use knotless_tests::cluster::FakeCluster;
use knotless_tests::{Ran, bin, bin_dir, ran};

/// The workspace's root folder.
fn source_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().expect("the workspace root")
}

/// What `id` says about the user running the tests.
fn id(flag: &str) -> String {
    let output = Command::new("id").arg(flag).output().expect("id runs");
    String::from_utf8(output.stdout).expect("utf-8").trim().to_string()
}

/// `deploy/SCRIPT ARGS` with `DESTDIR` and the default `PREFIX`.
fn script(name: &str, destdir: &Path, args: &[&str]) -> Ran {
    let mut command = Command::new("bash");
    command.arg(source_root().join("deploy").join(name)).args(args).env("DESTDIR", destdir).env("PREFIX", "/usr/local");
    ran(command)
}

/// `install.sh` with the built binaries, as the current user, into `destdir`.
fn install(destdir: &Path, extra: &[&str]) -> Ran {
    let bins = bin_dir().display().to_string();
    let user = id("-un");
    let mut args = vec!["--bin-dir", bins.as_str(), "--user", user.as_str()];
    args.extend_from_slice(extra);
    let run = script("install.sh", destdir, &args);
    assert_eq!(run.code, Some(0), "install.sh failed\n{}", run.both());
    run
}

fn uninstall(destdir: &Path, extra: &[&str]) -> Ran {
    let run = script("uninstall.sh", destdir, extra);
    assert_eq!(run.code, Some(0), "uninstall.sh failed\n{}", run.both());
    run
}

/// Every path under `root` (relative, without a leading slash) with its type, mode, owner and,
/// for a file, its length and a hash of its content.
fn tree(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, into: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
            let path = entry.path();
            let metadata = std::fs::symlink_metadata(&path).expect("metadata");
            let relative = path.strip_prefix(root).expect("under root").display().to_string();
            let mode = metadata.permissions().mode() & 0o7777;
            let what = if metadata.is_dir() {
                walk(root, &path, into);
                "dir".to_string()
            } else if metadata.file_type().is_symlink() {
                format!("link {}", std::fs::read_link(&path).expect("readlink").display())
            } else {
                use std::hash::{Hash, Hasher};
                let bytes = std::fs::read(&path).expect("read");
                let mut hasher = std::collections::hash_map::DefaultHasher::new();
                bytes.hash(&mut hasher);
                format!("file {} bytes, hash {:016x}", bytes.len(), hasher.finish())
            };
            into.insert(relative, format!("{mode:o} {} {what}", metadata.uid()));
        }
    }
    let mut found = BTreeMap::new();
    walk(root, root, &mut found);
    found
}

/// A staging root with things of its own that an install must leave alone.
fn staging_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("tempdir");
    for (path, text, mode) in [
        ("usr/local/bin/other-tool", "#!/bin/sh\n", 0o755),
        ("etc/systemd/system/other.service", "[Service]\nExecStart=/bin/true\n", 0o644),
        ("usr/libexec/other/helper", "#!/bin/sh\n", 0o755),
    ] {
        let path = root.path().join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, text).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    root
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap_or_else(|error| panic!("{}: {error}", path.display())).permissions().mode() & 0o7777
}

/// The paths an uninstall without `--purge` keeps: the configuration, the state, and the
/// folders that hold them.
fn kept(path: &str) -> bool {
    ["etc/knotless", "var"].iter().any(|kept| path == *kept || path.starts_with(&format!("{kept}/")))
}

#[test]
fn install_lays_out_the_fixed_paths_and_uninstall_removes_exactly_what_it_added() {
    let root = staging_root();
    let destdir = root.path();
    let before = tree(destdir);
    let kubeconfig = tempfile::NamedTempFile::new().expect("kubeconfig");
    std::fs::write(kubeconfig.path(), "apiVersion: v1\nkind: Config\n").expect("write kubeconfig");
    install(destdir, &["--kubeconfig", &kubeconfig.path().display().to_string(), "--docker"]);

    let at = |path: &str| destdir.join(path);
    let uid: u32 = id("-u").parse().expect("uid");
    let user = id("-un");
    for (path, built) in [
        ("usr/local/bin/knotless-run", "knotless-run"),
        ("usr/libexec/knotless/kubernetes", "knotless-executor-kubernetes"),
        ("usr/libexec/knotless/docker", "knotless-executor-docker"),
        ("usr/libexec/knotless/shell", "knotless-executor-shell"),
    ] {
        assert_eq!(mode(&at(path)), 0o755, "{path}");
        assert!(std::fs::read(at(path)).expect("installed") == std::fs::read(bin(built)).expect("built"), "{path}");
    }
    for path in ["usr/local/libexec/knotless/scoped-kubeconfig", "usr/local/libexec/knotless/refresh-kubeconfig"] {
        assert_eq!(mode(&at(path)), 0o755, "{path}");
    }
    for path in [
        "etc/systemd/system/knotless-run.service",
        "etc/systemd/system/knotless-refresh-kubeconfig.service",
        "etc/systemd/system/knotless-refresh-kubeconfig.timer",
        "etc/systemd/system/knotless-run.service.d/docker.conf",
        "usr/local/share/doc/knotless/kubernetes-runner.md",
        "usr/local/share/knotless/installed-files",
    ] {
        assert_eq!(mode(&at(path)), 0o644, "{path}");
    }
    // The manual pages, the runner's own and one per subcommand, as roff naming the subcommands.
    for page in ["knotless-run.1", "knotless-run-run.1", "knotless-run-completions.1", "knotless-run-plugin-check.1"] {
        assert_eq!(mode(&at(&format!("usr/local/share/man/man1/{page}"))), 0o644, "{page}");
    }
    let page = std::fs::read_to_string(at("usr/local/share/man/man1/knotless-run.1")).expect("the page");
    assert!(page.contains(".TH knotless-run 1") && page.contains("knotless\\-run\\-checks(1)"), "{page}");
    assert!(!at("usr/local/share/man/man1/knotless-run-manpage.1").exists(), "the hidden subcommand has a page");
    let unit = std::fs::read_to_string(at("etc/systemd/system/knotless-run.service")).expect("unit");
    assert!(unit.contains(&format!("\nUser={user}\n")), "{unit}");
    assert!(
        unit.contains(
            "\nExecStart=/usr/local/bin/knotless-run $KNOTLESS_EXECUTOR_ARGS $KNOTLESS_ARGS $KNOTLESS_REPOS\n"
        )
    );
    assert_eq!(mode(&at("etc/knotless/env")), 0o600);
    assert_eq!(
        std::fs::read_to_string(at("etc/knotless/env")).expect("env"),
        std::fs::read_to_string(source_root().join("deploy/env.example")).expect("env.example")
    );
    assert_eq!(mode(&at("etc/knotless/tenant.kubeconfig")), 0o600);
    assert_eq!(
        std::fs::read_to_string(at("etc/knotless/tenant.kubeconfig")).expect("kubeconfig"),
        "apiVersion: v1\nkind: Config\n"
    );
    for path in ["var/lib/knotless", "var/lib/knotless/caches", "var/lib/knotless/mirrors", "var/lib/knotless/work"] {
        assert_eq!(mode(&at(path)), 0o700, "{path}");
        assert_eq!(std::fs::metadata(at(path)).expect("state").uid(), uid, "{path} is not the service user's");
    }
    // The manifest accounts for everything the install added.
    let manifest = std::fs::read_to_string(at("usr/local/share/knotless/installed-files")).expect("manifest");
    let listed: Vec<&str> =
        manifest.lines().filter_map(|line| line.split_once(' ').map(|(_, path)| &path[1..])).collect();
    let installed = tree(destdir);
    for path in installed.keys().filter(|path| !before.contains_key(*path)) {
        let accounted = listed.iter().any(|listed| path == listed || path.starts_with(&format!("{listed}/")));
        assert!(accounted, "{path} was installed but is not in the manifest:\n{manifest}");
    }
    for path in before.keys() {
        assert_eq!(before.get(path), installed.get(path), "the install changed {path}");
    }

    // Without --purge: back to the tree before, apart from the configuration and the state.
    uninstall(destdir, &[]);
    let after = tree(destdir);
    for (path, entry) in &after {
        assert!(before.get(path) == Some(entry) || kept(path), "uninstall.sh left {path}");
    }
    for path in before.keys() {
        assert_eq!(before.get(path), after.get(path), "uninstall.sh changed {path}");
    }
    for path in ["etc/knotless/env", "etc/knotless/tenant.kubeconfig", "var/lib/knotless/caches"] {
        assert!(at(path).exists(), "uninstall.sh removed {path} without --purge");
    }

    // --purge: exactly the tree before.
    uninstall(destdir, &["--purge"]);
    assert_eq!(tree(destdir), before);
}

#[test]
fn a_second_install_keeps_the_env_file_and_the_state() {
    let root = staging_root();
    let destdir = root.path();
    let before = tree(destdir);
    install(destdir, &["--no-docker"]);
    let env = destdir.join("etc/knotless/env");
    std::fs::write(&env, "KNOTLESS_ARGS=--runner-id mine\n").expect("edit env");
    let key = destdir.join("var/lib/knotless/secrets-key.json");
    std::fs::write(&key, "{\"key\": \"kept\"}").expect("key");

    let again = install(destdir, &["--no-docker"]);
    assert!(again.stderr.contains("kept the existing /etc/knotless/env"), "{}", again.both());
    assert_eq!(std::fs::read_to_string(&env).expect("env"), "KNOTLESS_ARGS=--runner-id mine\n");
    assert_eq!(mode(&env), 0o600);
    assert_eq!(std::fs::read_to_string(&key).expect("key"), "{\"key\": \"kept\"}");
    assert!(!destdir.join("etc/systemd/system/knotless-run.service.d").exists(), "--no-docker installed the drop-in");

    // An uninstall keeps both; a later purge still finds what the first install added.
    uninstall(destdir, &[]);
    assert_eq!(std::fs::read_to_string(&env).expect("env kept"), "KNOTLESS_ARGS=--runner-id mine\n");
    assert!(key.exists(), "uninstall.sh removed the secrets key without --purge");
    uninstall(destdir, &["--purge"]);
    assert_eq!(tree(destdir), before);
}

/// `systemd-analyze verify` of unit files; its complaints, minus those `accept` allows.
fn verify(units: &[PathBuf], accept: impl Fn(&str) -> bool) -> Vec<String> {
    let run = ran({
        let mut command = Command::new("systemd-analyze");
        command.arg("verify").args(units);
        command
    });
    let complaints: Vec<String> =
        run.stderr.lines().filter(|line| !line.trim().is_empty() && !accept(line)).map(str::to_string).collect();
    if run.stderr.trim().is_empty() {
        assert_eq!(run.code, Some(0), "systemd-analyze verify failed without saying why\n{}", run.both());
    }
    complaints
}

#[test]
fn systemd_analyze_accepts_the_units() {
    if Command::new("systemd-analyze").arg("--version").output().is_err() {
        eprintln!("skipped: systemd-analyze is not installed (Debian's systemd package has it)");
        return;
    }
    let names = ["knotless-run.service", "knotless-refresh-kubeconfig.service", "knotless-refresh-kubeconfig.timer"];
    // The units as shipped: only the binaries they start may be missing on this machine.
    let shipped: Vec<PathBuf> = names.iter().map(|name| source_root().join("deploy").join(name)).collect();
    let complaints = verify(&shipped, |line| line.contains("is not executable: No such file or directory"));
    assert!(complaints.is_empty(), "systemd-analyze verify of deploy/: {complaints:#?}");

    // The installed units, with the docker drop-in, pointed at the installed binaries: no
    // complaint at all.
    let root = staging_root();
    install(root.path(), &["--docker"]);
    let copies = tempfile::tempdir().expect("tempdir");
    let prefix = format!("{}/usr/local/", root.path().display());
    for name in names.iter().chain(&["knotless-run.service.d/docker.conf"]) {
        let text = std::fs::read_to_string(root.path().join("etc/systemd/system").join(name)).expect("installed unit");
        let copy = copies.path().join(name);
        std::fs::create_dir_all(copy.parent().expect("parent")).expect("mkdir");
        std::fs::write(copy, text.replace("/usr/local/", &prefix)).expect("copy");
    }
    let installed: Vec<PathBuf> = names.iter().map(|name| copies.path().join(name)).collect();
    let complaints = verify(&installed, |_| false);
    assert!(complaints.is_empty(), "systemd-analyze verify of the installed units: {complaints:#?}");
}

/// The fenced `sh` blocks of a Markdown text that follow a `<!-- test: fake-cluster -->` line.
fn marked_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut lines = markdown.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "<!-- test: fake-cluster -->" {
            continue;
        }
        assert_eq!(lines.next().map(str::trim), Some("```sh"), "a marked block must follow its marker");
        let block: Vec<&str> = lines.by_ref().take_while(|line| line.trim() != "```").collect();
        blocks.push(block.join("\n"));
    }
    blocks
}

/// The names the guide's variable block sets (`NAME=value  # comment` lines).
fn guide_variables(markdown: &str) -> Vec<String> {
    let start = markdown.find("```sh\nKUBECONFIG_ADMIN=").expect("the guide's variable block");
    let block = &markdown[start + 6..];
    let block = &block[..block.find("```").expect("its end")];
    block.lines().filter_map(|line| line.split_once('=').map(|(name, _)| name.to_string())).collect()
}

#[test]
fn the_kubernetes_guide_runs_against_the_fake_cluster() {
    let guide = std::fs::read_to_string(source_root().join("docs/guide/kubernetes-runner.md")).expect("the guide");
    let blocks = marked_blocks(&guide);
    assert!(blocks.len() >= 5, "the guide marks {} blocks for the test", blocks.len());

    let work = tempfile::tempdir().expect("tempdir");
    // One node, as the guide says `plugin check` needs no more.
    let cluster = FakeCluster::start(&["--grace", "2s", "--nodes", "1"]);
    let admin = cluster.kubeconfig.display().to_string();
    // Nothing may run kubectl: one on PATH leaves a mark if it is ever run.
    let trap = work.path().join("trap");
    std::fs::create_dir(&trap).expect("mkdir");
    let mark = work.path().join("kubectl-was-run");
    let kubectl = format!("#!/bin/sh\necho \"$@\" >> '{}'\nexit 1\n", mark.display());
    std::fs::write(trap.join("kubectl"), kubectl).expect("a kubectl trap");
    std::fs::set_permissions(trap.join("kubectl"), std::fs::Permissions::from_mode(0o755)).expect("chmod");

    // The guide's commands run against what install.sh laid out.
    let destdir = work.path().join("root");
    std::fs::create_dir(&destdir).expect("mkdir");
    install(&destdir, &["--no-docker"]);
    let tenant = destdir.join("etc/knotless/tenant.kubeconfig");
    let path = format!(
        "{}:{}:{}",
        trap.display(),
        destdir.join("usr/local/bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let variables: BTreeMap<&str, String> = BTreeMap::from([
        ("KUBECONFIG_ADMIN", admin),
        ("NAMESPACE", "knotless-runs".to_string()),
        ("RUNNER_USER", id("-un")),
        ("TENANT_KUBECONFIG", tenant.display().to_string()),
        ("LIBEXEC", destdir.join("usr/local/libexec/knotless").display().to_string()),
        ("PLUGIN_DIR", destdir.join("usr/libexec/knotless").display().to_string()),
        ("REPO", source_root().join("examples/demo").display().to_string()),
    ]);
    let mut named: Vec<String> = variables.keys().map(|name| name.to_string()).collect();
    let mut in_guide = guide_variables(&guide);
    named.sort();
    in_guide.sort();
    assert_eq!(named, in_guide, "the test must set exactly the guide's variables");

    let scratch = work.path().join("scratch");
    std::fs::create_dir(&scratch).expect("mkdir");
    let mut command = Command::new("bash");
    command
        .arg("-c")
        .arg(format!("set -euo pipefail\n{}\n", blocks.join("\n")))
        .current_dir(&scratch)
        .env("PATH", path)
        .env("HOME", &scratch)
        .env("TMPDIR", &scratch)
        .env("KNOTLESS_LOG", "info");
    for (name, value) in &variables {
        command.env(name, value);
    }
    let run = ran(command);
    assert_eq!(run.code, Some(0), "the guide's commands failed\n{}", run.both());

    // The scoped kubeconfig was made, then refreshed, in place and private.
    assert_eq!(run.stdout.matches("scoped-kubeconfig: wrote").count(), 2, "{}", run.both());
    assert_eq!(mode(&tenant), 0o600);
    let scoped = std::fs::read_to_string(&tenant).expect("the tenant kubeconfig");
    let token = scoped.lines().find_map(|line| line.trim().strip_prefix("token: ")).expect("a token").trim_matches('"');
    assert!(!token.is_empty() && !run.both().contains(token), "a token was printed\n{}", run.both());
    assert!(run.stdout.contains("deletecollection pods: yes"), "{}", run.both());
    assert!(run.stdout.contains("get secrets: no") && run.stdout.contains("get nodes: no"), "{}", run.both());
    // plugin check passed, and the demo's workflows ran as Jobs with the scoped credential.
    assert!(run.stdout.contains(" passed, 0 failed"), "{}", run.both());
    let requests = cluster.requests();
    let jobs = requests["by"]["create jobs"].as_u64().unwrap_or(0);
    assert!(jobs >= 2, "no Jobs were created: {requests:#}");
    assert!(!mark.exists(), "kubectl was run: {}", std::fs::read_to_string(&mark).unwrap_or_default());
    cluster.wait_clean();
    uninstall(&destdir, &["--purge"]);
}

/// The variables of a systemd environment file: `NAME=VALUE` lines, `#` comments, a later line
/// for the same name winning.
fn environment_file(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .filter_map(|line| line.split_once('='))
        .map(|(name, value)| (name.trim().to_string(), value.trim().to_string()))
        .collect()
}

#[test]
fn the_daemon_starts_from_the_example_env_file_runs_a_push_and_hands_over() {
    let work = tempfile::tempdir().expect("tempdir");
    let cluster = FakeCluster::start(&["--grace", "2s", "--nodes", "3"]);
    let kubeconfig = cluster.kubeconfig.display().to_string();
    let repo = knotless_tests::Repo::init(&work.path().join("repo"));
    repo.write(".knotless/workflows/hello.yml", "steps:\n  - name: hello\n    run: echo hello from the unit\n");
    let commit = repo.commit("a workflow");

    // The unit's command line: `knotless-run $KNOTLESS_EXECUTOR_ARGS $KNOTLESS_ARGS
    // $KNOTLESS_REPOS`, each variable split on whitespace, as systemd does without a shell. Only
    // the host's paths are swapped for the test's.
    let unit = std::fs::read_to_string(source_root().join("deploy/knotless-run.service")).expect("the unit");
    assert!(unit.contains("$KNOTLESS_EXECUTOR_ARGS $KNOTLESS_ARGS $KNOTLESS_REPOS"), "{unit}");
    let variables = environment_file(&std::fs::read_to_string(source_root().join("deploy/env.example")).expect("env"));
    let state = work.path().join("state");
    let mut args: Vec<String> = ["KNOTLESS_EXECUTOR_ARGS", "KNOTLESS_ARGS", "KNOTLESS_REPOS"]
        .iter()
        .flat_map(|name| variables.get(*name).map(String::as_str).unwrap_or("").split_whitespace())
        .map(|arg| match arg {
            "/etc/knotless/tenant.kubeconfig" => kubeconfig.clone(),
            "/var/lib/knotless" => state.display().to_string(),
            other => other.to_string(),
        })
        .collect();
    // `Runner` names the state folder itself.
    let at = args.iter().position(|arg| arg == "--state").expect("the example sets --state");
    args.drain(at..at + 2);
    args.push(repo.url());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut runner = knotless_tests::Runner::start(&state, &args);
    let checks = runner.final_checks(&repo.url(), &commit, 1);
    assert_eq!(checks[0]["status"], "success", "{checks:#?}\n{}", runner.stderr());
    let log = runner.run_log(checks[0]["run_id"].as_str().expect("a run id"));
    assert!(log.contains("hello from the unit"), "{log}");
    runner.signal(nix::sys::signal::Signal::SIGTERM);
    let status = runner.wait();
    assert_eq!(status.code(), Some(0), "{}", runner.stderr());
    assert!(runner.stderr().contains("handed over"), "{}", runner.stderr());
    cluster.wait_clean();
}
