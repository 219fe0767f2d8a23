//! The Debian packages (`make package`: deploy/package.sh with cargo-deb), made from the built
//! binaries: one a binary, each with its crate's version, the executors depending on a protocol
//! version the runner provides; the runner's and the shell executor's, unpacked with `dpkg -x`
//! into a fresh folder, run a workflow.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use knotless_protocol::SUPPORTED_VERSIONS;
use knotless_tests::{Repo, ran};

fn source_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().expect("the workspace root")
}

/// The `version` of a crate's Cargo.toml.
fn crate_version(folder: &str) -> String {
    let manifest = std::fs::read_to_string(source_root().join(folder).join("Cargo.toml")).expect("Cargo.toml");
    manifest
        .lines()
        .find_map(|line| line.strip_prefix("version = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .unwrap_or_else(|| panic!("{folder}/Cargo.toml has no version of its own"))
        .to_string()
}

/// A control field of a package.
fn field(deb: &Path, name: &str) -> String {
    let run = ran({
        let mut command = Command::new("dpkg-deb");
        command.arg("--field").arg(deb).arg(name);
        command
    });
    assert_eq!(run.code, Some(0), "dpkg-deb --field {} {name}\n{}", deb.display(), run.both());
    run.stdout.trim().to_string()
}

fn unpack(deb: &Path, root: &Path) {
    let run = ran({
        let mut command = Command::new("dpkg");
        command.arg("-x").arg(deb).arg(root);
        command
    });
    assert_eq!(run.code, Some(0), "dpkg -x {}\n{}", deb.display(), run.both());
}

/// The packages, by name.
type Debs = BTreeMap<&'static str, PathBuf>;

const PACKAGES: [(&str, &str); 4] = [
    ("knotless-run", "runner"),
    ("knotless-executor-kubernetes", "plugins/kubernetes"),
    ("knotless-executor-docker", "plugins/docker"),
    ("knotless-executor-shell", "plugins/shell"),
];

/// The packages of the built (debug) binaries, made once for the tests here; none without
/// cargo-deb, but in CI.
fn packages() -> Option<&'static Debs> {
    static MADE: OnceLock<Option<Debs>> = OnceLock::new();
    MADE.get_or_init(|| {
        if Command::new("cargo-deb").arg("--version").output().is_err() {
            assert!(std::env::var_os("CI").is_none(), "cargo-deb is not installed: .ci/run installs it");
            eprintln!("skipped: cargo-deb is not installed (cargo install cargo-deb --locked)");
            return None;
        }
        let output = Path::new(env!("CARGO_TARGET_TMPDIR")).join("packages");
        let _ = std::fs::remove_dir_all(&output);
        let mut command = Command::new("bash");
        command.arg(source_root().join("deploy/package.sh")).args(["--profile", "dev", "--output"]).arg(&output);
        let made = ran(command);
        assert_eq!(made.code, Some(0), "deploy/package.sh\n{}", made.both());
        let names: Vec<String> = std::fs::read_dir(&output)
            .expect("the output")
            .map(|entry| entry.expect("an entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 4, "four packages, nothing else: {names:?}");
        let mut debs = Debs::new();
        for (name, folder) in PACKAGES {
            let version = format!("{}-1", crate_version(folder));
            let deb = output.join(format!("{name}_{version}_amd64.deb"));
            assert!(deb.exists(), "no {} among {names:?}", deb.display());
            debs.insert(name, deb);
        }
        Some(debs)
    })
    .as_ref()
}

#[test]
fn each_binary_is_a_package_of_its_own_version_and_two_of_them_run_a_workflow_from_a_fresh_folder() {
    let Some(debs) = packages() else { return };
    for (name, folder) in PACKAGES {
        assert_eq!(field(&debs[name], "Package"), name);
        assert_eq!(
            field(&debs[name], "Version"),
            format!("{}-1", crate_version(folder)),
            "{name} has its crate's version"
        );
    }

    // The executors depend on a protocol the runner provides, never on the runner's version.
    let protocols: Vec<String> =
        SUPPORTED_VERSIONS.iter().map(|version| format!("knotless-run-protocol-{version}")).collect();
    let provides = field(&debs["knotless-run"], "Provides");
    for protocol in &protocols {
        assert!(
            provides.split(", ").any(|provided| provided == protocol),
            "knotless-run provides {protocol}: {provides}"
        );
    }
    for executor in ["knotless-executor-kubernetes", "knotless-executor-docker", "knotless-executor-shell"] {
        let depends = field(&debs[executor], "Depends");
        assert!(protocols.iter().any(|protocol| depends.contains(protocol.as_str())), "{executor}: {depends}");
        assert!(!depends.contains("knotless-run ") && !depends.contains("knotless-run,"), "{executor}: {depends}");
    }

    let root = tempfile::tempdir().expect("a folder");
    for name in ["knotless-run", "knotless-executor-shell"] {
        unpack(&debs[name], root.path());
    }
    let env = std::fs::metadata(root.path().join("etc/knotless/env")).expect("/etc/knotless/env");
    assert_eq!(env.permissions().mode() & 0o777, 0o600);
    let control = ran({
        let mut command = Command::new("dpkg-deb");
        command.arg("--info").arg(&debs["knotless-run"]).arg("conffiles");
        command
    });
    assert_eq!(control.stdout.trim(), "/etc/knotless/env", "the env file is a conffile, never overwritten");
    for file in [
        "usr/share/man/man1/knotless-run-run.1.gz",
        "lib/systemd/system/knotless-run.service",
        "usr/libexec/knotless/shell",
    ] {
        assert!(root.path().join(file).exists(), "{file} is in the packages");
    }
    verify_units(root.path());

    runs_a_workflow(root.path());
}

/// The runner under `root` runs a workflow with the shell executor under `root`.
fn runs_a_workflow(root: &Path) {
    let repo = Repo::new();
    repo.workflow("packaged", "on: [push]\nsteps:\n  - name: hello\n    run: echo \"hello from $KNOTLESS_WORKFLOW\"\n");
    repo.commit("a workflow");
    let run = ran({
        let mut command = Command::new(root.join("usr/bin/knotless-run"));
        command
            .arg("run")
            .arg(repo.path())
            .args(["--executor", "shell", "--plugin-dir"])
            .arg(root.join("usr/libexec/knotless"));
        command.env("XDG_CONFIG_HOME", root.join("config")).env("XDG_CACHE_HOME", root.join("cache"));
        command
    });
    assert_eq!(run.code, Some(0), "{}", run.both());
    assert!(run.stdout.contains("packaged/hello | hello from packaged"), "{}", run.both());
}

/// The packaged units, pointed at the unpacked binaries, through `systemd-analyze verify`.
fn verify_units(root: &Path) {
    if Command::new("systemd-analyze").arg("--version").output().is_err() {
        assert!(std::env::var_os("CI").is_none(), "systemd-analyze is not installed: .ci/run installs it");
        return;
    }
    let copies = tempfile::tempdir().expect("a folder");
    let mut units = Vec::new();
    for name in ["knotless-run.service", "knotless-refresh-kubeconfig.service", "knotless-refresh-kubeconfig.timer"] {
        let text = std::fs::read_to_string(root.join("lib/systemd/system").join(name)).expect("a packaged unit");
        let copy = copies.path().join(name);
        std::fs::write(&copy, text.replace("/usr/", &format!("{}/usr/", root.display()))).expect("a copy");
        units.push(copy);
    }
    let run = ran({
        let mut command = Command::new("systemd-analyze");
        command.arg("verify").args(&units);
        command
    });
    assert!(
        run.stderr.trim().is_empty() && run.code == Some(0),
        "systemd-analyze verify of the packaged units\n{}",
        run.both()
    );
}

/// A fresh root for `dpkg --root`: an empty package database but for stand-ins of what the
/// host provides (the C library, git, a Docker CLI), and empty user databases.
fn fresh_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("a folder");
    for folder in ["etc", "var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers"] {
        std::fs::create_dir_all(root.path().join(folder)).expect("mkdir");
    }
    for file in ["etc/passwd", "etc/group", "etc/shadow", "etc/gshadow", "var/lib/dpkg/available"] {
        std::fs::write(root.path().join(file), "").expect("an empty file");
    }
    let stand_in = |name: &str, version: &str| {
        format!(
            "Package: {name}\nStatus: install ok installed\nPriority: optional\nMaintainer: the host\n\
             Architecture: amd64\nVersion: {version}\nDescription: the host's {name}\n\n"
        )
    };
    let status =
        [stand_in("libc6", "2.36-9"), stand_in("git", "1:2.39.5-0"), stand_in("docker.io", "20.10.24")].concat();
    std::fs::write(root.path().join("var/lib/dpkg/status"), status).expect("the status file");
    root
}

/// `dpkg --root ROOT ARGS`, maintainer scripts run outside the root with `DPKG_ROOT` set.
fn dpkg(root: &Path, args: &[&std::ffi::OsStr]) -> knotless_tests::Ran {
    ran({
        let mut command = Command::new("dpkg");
        command.arg("--root").arg(root).arg("--force-script-chrootless").arg("--log").arg(root.join("dpkg.log"));
        command.args(args);
        command
    })
}

/// `dpkg-query --root ROOT --showformat ... --show PACKAGE`: its status and version.
fn installed(root: &Path, package: &str) -> String {
    let run = ran({
        let mut command = Command::new("dpkg-query");
        command.arg("--root").arg(root).args(["--showformat", "${Status} ${Version}", "--show", package]);
        command
    });
    run.stdout
}

#[test]
fn the_packages_install_into_a_root_and_one_executor_rolls_back_alone() {
    let Some(debs) = packages() else { return };
    if nix::unistd::geteuid().as_raw() != 0 {
        eprintln!("skipped: dpkg --root needs root here");
        return;
    }
    let host_user = ran({
        let mut command = Command::new("getent");
        command.args(["passwd", "knotless"]);
        command
    });
    // An earlier release of the shell executor: its package, at a lower version.
    let earlier = tempfile::tempdir().expect("a folder");
    let made = ran({
        let mut command = Command::new("cargo");
        command.current_dir(source_root()).args([
            "deb",
            "--no-build",
            "--profile",
            "dev",
            "--strip",
            "--fast",
            "--quiet",
        ]);
        command.args(["-p", "knotless-executor-shell", "--deb-version", "0.1.0-1", "--output"]).arg(earlier.path());
        command
    });
    assert_eq!(made.code, Some(0), "{}", made.both());
    let earlier_shell = earlier.path().join("knotless-executor-shell_0.1.0-1_amd64.deb");

    let root = fresh_root();
    let root = root.path();
    let mut args = vec![std::ffi::OsStr::new("--install")];
    args.extend(
        ["knotless-run", "knotless-executor-docker", "knotless-executor-shell"].map(|name| debs[name].as_os_str()),
    );
    let install = dpkg(root, &args);
    assert_eq!(install.code, Some(0), "dpkg --install\n{}", install.both());
    for (name, folder) in PACKAGES.iter().filter(|(name, _)| *name != "knotless-executor-kubernetes") {
        assert_eq!(installed(root, name), format!("install ok installed {}-1", crate_version(folder)));
    }
    // postinst made the service user in the root's own user database, and its state folder.
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).expect("the root's passwd");
    assert!(passwd.starts_with("knotless:x:"), "{passwd}");
    let state = std::fs::metadata(root.join("var/lib/knotless/work")).expect("the state folder");
    assert_eq!(state.permissions().mode() & 0o777, 0o700);
    runs_a_workflow(root);

    // The operator's settings survive a reinstall: /etc/knotless/env is a conffile.
    std::fs::write(root.join("etc/knotless/env"), "KNOTLESS_ARGS=--pulls\n").expect("edit the env file");
    let reinstall = dpkg(root, &[std::ffi::OsStr::new("--install"), debs["knotless-run"].as_os_str()]);
    assert_eq!(reinstall.code, Some(0), "{}", reinstall.both());
    assert_eq!(std::fs::read_to_string(root.join("etc/knotless/env")).expect("env"), "KNOTLESS_ARGS=--pulls\n");

    // Rolling the shell executor back leaves the runner and the Docker executor as they were.
    let hash = |path: &str| std::fs::read(root.join(path)).expect("an installed file");
    let (runner, docker) = (hash("usr/bin/knotless-run"), hash("usr/libexec/knotless/docker"));
    let rollback = dpkg(root, &[std::ffi::OsStr::new("--install"), earlier_shell.as_os_str()]);
    assert_eq!(rollback.code, Some(0), "{}", rollback.both());
    assert!(rollback.both().contains("downgrading"), "{}", rollback.both());
    assert_eq!(installed(root, "knotless-executor-shell"), "install ok installed 0.1.0-1");
    assert_eq!(installed(root, "knotless-run"), format!("install ok installed {}-1", crate_version("runner")));
    let docker_version = crate_version("plugins/docker");
    assert_eq!(installed(root, "knotless-executor-docker"), format!("install ok installed {docker_version}-1"));
    assert!(hash("usr/bin/knotless-run") == runner && hash("usr/libexec/knotless/docker") == docker);
    runs_a_workflow(root);

    // Nothing of the host's changed: its user database has no new user.
    let after = ran({
        let mut command = Command::new("getent");
        command.args(["passwd", "knotless"]);
        command
    });
    assert_eq!(after.stdout, host_user.stdout, "the host's users are as they were");
}
