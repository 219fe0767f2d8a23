//! The argv of every docker CLI call this executor makes, built by pure functions so that
//! what reaches a command line is visible in one place and tested without running anything.
//!
//! No variable value and no secret is ever an argument here: a step's environment travels on
//! the stdin of `docker exec -i <container> sh -s` (see [`knotless_protocol::sdk::payload`]).

/// The label every container carries with the runner's id; `cleanup` finds containers by it.
pub const RUNNER_LABEL: &str = "dev.knotless.runner";
/// The label naming the session a container belongs to.
pub const SESSION_LABEL: &str = "dev.knotless.session";
/// The label naming the run.
pub const RUN_LABEL: &str = "dev.knotless.run";
/// The label naming the workflow.
pub const WORKFLOW_LABEL: &str = "dev.knotless.workflow";
/// The label naming the repository.
pub const REPOSITORY_LABEL: &str = "dev.knotless.repository";
/// The label naming the process that made a container or network: its
/// [`knotless_protocol::owner`] token, which `cleanup` checks before it removes anything.
pub const OWNER_LABEL: &str = "dev.knotless.owner";

/// The folders every session has, created by `start`.
pub const SESSION_FOLDERS: [&str; 3] = ["/work", "/steps", "/outputs"];

/// What keeps a session's container alive between steps: a shell sleeping, under the init
/// process `--init` adds (which reaps the zombies steps leave). With a lifetime it sleeps that
/// long and the container then stops by itself, as a Job past its `activeDeadlineSeconds`:
/// a container whose runner and executor both died does not run forever.
pub fn keep_alive(lifetime_secs: Option<u64>) -> String {
    match lifetime_secs {
        Some(seconds) => format!("sleep {seconds}"),
        None => "while :; do sleep 86400; done".to_string(),
    }
}

/// What `start` creates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerSpec {
    /// The container's name.
    pub name: String,
    /// The image, which must already be on the engine: it is never pulled.
    pub image: String,
    /// Labels, in order.
    pub labels: Vec<(String, String)>,
    /// `--pids-limit`.
    pub pids_limit: u32,
    /// `--cpus`, as docker takes it (`0.5`).
    pub cpus: Option<String>,
    /// `--memory` (and `--memory-swap`, the same: no swap past it), in bytes.
    pub memory: Option<u64>,
    /// Whether the container may use the network (else `--network none`, or only its
    /// services' network).
    pub network: bool,
    /// The session's own network, where its services are, when it has services: the container
    /// joins it (and, with `network`, the engine's default network after it started).
    pub services_network: Option<String>,
    /// Seconds after which the container stops by itself; `None` for a kept session.
    pub lifetime_secs: Option<u64>,
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|item| item.to_string()).collect()
}

/// `docker version`, printing only the engine's version: fails when no engine answers.
pub fn version() -> Vec<String> {
    strings(&["version", "--format", "{{.Server.Version}}"])
}

/// `docker run --detach`: creates and starts a session's container, never pulling its image,
/// with no capabilities, no privilege escalation, no host mount, and no network unless asked.
pub fn run_container(spec: &ContainerSpec) -> Vec<String> {
    let mut argv = strings(&["run", "--detach", "--pull", "never", "--name"]);
    argv.push(spec.name.clone());
    for (key, value) in &spec.labels {
        argv.push("--label".into());
        argv.push(format!("{key}={value}"));
    }
    argv.extend(strings(&["--init", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]));
    argv.push("--pids-limit".into());
    argv.push(spec.pids_limit.to_string());
    if let Some(cpus) = &spec.cpus {
        argv.push("--cpus".into());
        argv.push(cpus.clone());
    }
    if let Some(memory) = spec.memory {
        argv.push("--memory".into());
        argv.push(memory.to_string());
        argv.push("--memory-swap".into());
        argv.push(memory.to_string());
    }
    match &spec.services_network {
        Some(network) => argv.extend(["--network".to_string(), network.clone()]),
        None if !spec.network => argv.extend(strings(&["--network", "none"])),
        None => {}
    }
    argv.extend(strings(&["--workdir", "/work", "--entrypoint", "sh"]));
    argv.push(spec.image.clone());
    argv.push("-c".into());
    argv.push(keep_alive(spec.lifetime_secs));
    argv
}

/// The network of a session that has services.
pub fn services_network(container: &str) -> String {
    format!("{container}.network")
}

/// The container of a session's service.
pub fn service_container(container: &str, service: &str) -> String {
    format!("{container}.service.{service}")
}

/// `docker network create --internal`: a session's own network, which reaches nothing outside
/// it, where its services answer to their names.
pub fn create_network(name: &str, labels: &[(String, String)]) -> Vec<String> {
    let mut argv = strings(&["network", "create", "--internal"]);
    for (key, value) in labels {
        argv.push("--label".into());
        argv.push(format!("{key}={value}"));
    }
    argv.push(name.to_string());
    argv
}

/// `docker network connect <network> <container>`.
pub fn connect(network: &str, container: &str) -> Vec<String> {
    strings(&["network", "connect", network, container])
}

/// `docker network rm <network>`.
pub fn remove_network(network: &str) -> Vec<String> {
    strings(&["network", "rm", network])
}

/// `docker network ls` of this runner's networks: name, session and owner, tab-separated.
pub fn list_networks(runner_id: &str) -> Vec<String> {
    let filter = format!("label={RUNNER_LABEL}={runner_id}");
    let format = format!("{{{{.Name}}}}\t{{{{.Label \"{SESSION_LABEL}\"}}}}\t{{{{.Label \"{OWNER_LABEL}\"}}}}");
    strings(&["network", "ls", "--filter", &filter, "--format", &format])
}

/// A service to run beside a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSpec {
    /// Its container's name.
    pub container: String,
    /// The name steps reach it by.
    pub alias: String,
    /// The session's network.
    pub network: String,
    /// Its image, never pulled.
    pub image: String,
    /// Its command, after the image (its CMD); `None`: the image's.
    pub command: Option<Vec<String>>,
    /// The names of its variables, whose values are in the docker CLI's environment only.
    pub env_names: Vec<String>,
    /// Labels, in order.
    pub labels: Vec<(String, String)>,
    /// `--pids-limit`.
    pub pids_limit: u32,
}

/// `docker run --detach` of a service: on the session's network only, under its name, no
/// privilege escalation, an init, the engine's default capabilities (a service is an image of
/// the workflow's choosing, such as a database that changes users), values never on the command
/// line (`-e NAME`).
pub fn run_service(spec: &ServiceSpec) -> Vec<String> {
    let mut argv = strings(&["run", "--detach", "--pull", "never", "--name"]);
    argv.push(spec.container.clone());
    for (key, value) in &spec.labels {
        argv.push("--label".into());
        argv.push(format!("{key}={value}"));
    }
    argv.extend(strings(&["--init", "--security-opt", "no-new-privileges", "--pids-limit"]));
    argv.push(spec.pids_limit.to_string());
    argv.extend(["--network".to_string(), spec.network.clone(), "--network-alias".to_string(), spec.alias.clone()]);
    for name in &spec.env_names {
        argv.extend(["--env".to_string(), name.clone()]);
    }
    argv.push(spec.image.clone());
    argv.extend(spec.command.iter().flatten().cloned());
    argv
}

/// `docker exec <container> sh -c <command>`: a service's health command.
pub fn health(container: &str, command: &str) -> Vec<String> {
    strings(&["exec", container, "sh", "-c", command])
}

/// `docker logs --tail 20 <container>`: the end of a service's output, for its error.
pub fn logs(container: &str) -> Vec<String> {
    strings(&["logs", "--tail", "20", container])
}

/// `docker exec <container> mkdir -p -- <paths>`.
pub fn make_folders(container: &str, paths: &[&str]) -> Vec<String> {
    let mut argv = strings(&["exec", container, "mkdir", "-p", "--"]);
    argv.extend(strings(paths));
    argv
}

/// `docker exec <container> sh -c …`: makes the folders, as [`make_folders`] does, and prints the
/// path of the image's `tar`, if it has one (uploads then unpack and merge in one `docker exec`).
pub fn make_folders_finding_tar(container: &str, paths: &[&str]) -> Vec<String> {
    let mut argv = strings(&["exec", container, "sh", "-c", "mkdir -p -- \"$@\" && { command -v tar || :; }", "sh"]);
    argv.extend(strings(paths));
    argv
}

/// `docker exec -i <container> <command>...`: a step's `sh -s`, whose payload comes on
/// stdin, or the sweep of its processes.
pub fn exec(container: &str, command: &[String]) -> Vec<String> {
    let mut argv = strings(&["exec", "-i", container]);
    argv.extend(command.iter().cloned());
    argv
}

/// `docker kill <container>`: ends a container whose step's processes cannot be swept.
pub fn kill(container: &str) -> Vec<String> {
    strings(&["kill", container])
}

/// `docker stats --no-stream` of a container's tasks (its cgroup's `pids.current`): read by the
/// engine, so nothing starts in the container.
pub fn tasks(container: &str) -> Vec<String> {
    strings(&["stats", "--no-stream", "--format", "{{.PIDs}}", container])
}

/// `docker cp - <container>:<path>`: unpacks a tar stream from stdin into an existing folder.
pub fn copy_in(container: &str, path: &str) -> Vec<String> {
    strings(&["cp", "-", &format!("{container}:{path}")])
}

/// `docker cp <container>:<path>/. -`: a tar stream of the folder's contents on stdout, its
/// entries relative to the folder (`./a/b`).
pub fn copy_out(container: &str, path: &str) -> Vec<String> {
    let folder = path.trim_end_matches('/');
    strings(&["cp", &format!("{container}:{folder}/."), "-"])
}

/// `docker rm --force --volumes <container>`.
pub fn remove(container: &str) -> Vec<String> {
    strings(&["rm", "--force", "--volumes", container])
}

/// `docker ps --all` of this runner's containers: one `name<TAB>session<TAB>owner` line each.
pub fn list(runner_id: &str) -> Vec<String> {
    let filter = format!("label={RUNNER_LABEL}={runner_id}");
    let format = format!("{{{{.Names}}}}\t{{{{.Label \"{SESSION_LABEL}\"}}}}\t{{{{.Label \"{OWNER_LABEL}\"}}}}");
    strings(&["ps", "--all", "--no-trunc", "--filter", &filter, "--format", &format])
}

/// `docker inspect` of a container's state (`running`, `exited`, ...).
pub fn state(container: &str) -> Vec<String> {
    strings(&["inspect", "--type", "container", "--format", "{{.State.Status}}", container])
}

/// A label value made safe for a command line: control characters become spaces.
pub fn label_value(value: &str) -> String {
    value.chars().map(|char| if char.is_control() { ' ' } else { char }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ContainerSpec {
        ContainerSpec {
            name: "knotless-r1-s1".into(),
            image: "knotless-test/busybox:1".into(),
            labels: vec![(RUNNER_LABEL.into(), "r1".into()), (SESSION_LABEL.into(), "s1".into())],
            pids_limit: 1024,
            cpus: Some("0.5".into()),
            memory: Some(536_870_912),
            network: false,
            services_network: None,
            lifetime_secs: None,
        }
    }

    #[test]
    fn a_session_with_services_joins_their_network_and_a_service_has_no_value_on_its_command_line() {
        let spec = ContainerSpec { services_network: Some("knotless-r1-s1.network".into()), ..spec() };
        let argv = run_container(&spec).join(" ");
        assert!(argv.contains("--network knotless-r1-s1.network --workdir"), "{argv}");
        assert!(!argv.contains("none"), "{argv}");
        let service = ServiceSpec {
            container: service_container("knotless-r1-s1", "db"),
            alias: "db".into(),
            network: services_network("knotless-r1-s1"),
            image: "postgres:16".into(),
            command: Some(vec!["postgres".into(), "-c".into(), "fsync=off".into()]),
            env_names: vec!["POSTGRES_PASSWORD".into()],
            labels: vec![(RUNNER_LABEL.into(), "r1".into())],
            pids_limit: 1024,
        };
        assert_eq!(
            run_service(&service).join(" "),
            "run --detach --pull never --name knotless-r1-s1.service.db --label dev.knotless.runner=r1 --init \
             --security-opt no-new-privileges --pids-limit 1024 --network knotless-r1-s1.network --network-alias db \
             --env POSTGRES_PASSWORD postgres:16 postgres -c fsync=off"
        );
        assert_eq!(
            create_network("n", &[(RUNNER_LABEL.into(), "r1".into())]),
            ["network", "create", "--internal", "--label", "dev.knotless.runner=r1", "n"]
        );
    }

    #[test]
    fn a_container_has_no_privileges_no_network_and_never_pulls() {
        assert_eq!(
            run_container(&spec()).join(" "),
            "run --detach --pull never --name knotless-r1-s1 --label dev.knotless.runner=r1 \
             --label dev.knotless.session=s1 --init --cap-drop ALL --security-opt no-new-privileges \
             --pids-limit 1024 --cpus 0.5 --memory 536870912 --memory-swap 536870912 --network none --workdir /work \
             --entrypoint sh \
             knotless-test/busybox:1 -c while :; do sleep 86400; done"
        );
    }

    #[test]
    fn a_container_with_a_lifetime_stops_by_itself() {
        let spec = ContainerSpec { lifetime_secs: Some(3900), ..spec() };
        assert_eq!(run_container(&spec)[run_container(&spec).len() - 2..], ["-c", "sleep 3900"]);
    }

    #[test]
    fn a_container_that_asks_for_the_network_gets_it_and_limits_are_optional() {
        let spec = ContainerSpec { network: true, cpus: None, memory: None, ..spec() };
        let argv = run_container(&spec);
        assert!(!argv.contains(&"none".to_string()));
        assert!(!argv.contains(&"--cpus".to_string()) && !argv.contains(&"--memory".to_string()));
        assert!(!argv.iter().any(|arg| arg == "-v" || arg == "--volume" || arg == "--mount" || arg == "--privileged"));
    }

    #[test]
    fn steps_sweeps_and_copies() {
        assert_eq!(exec("c", &strings(&["sh", "-s"])), ["exec", "-i", "c", "sh", "-s"]);
        assert_eq!(kill("c"), ["kill", "c"]);
        assert_eq!(copy_in("c", "/work/x"), ["cp", "-", "c:/work/x"]);
        assert_eq!(copy_out("c", "/work/x/"), ["cp", "c:/work/x/.", "-"]);
        assert_eq!(copy_out("c", "/"), ["cp", "c:/.", "-"]);
        assert_eq!(
            make_folders("c", &SESSION_FOLDERS),
            ["exec", "c", "mkdir", "-p", "--", "/work", "/steps", "/outputs"]
        );
        assert_eq!(remove("c"), ["rm", "--force", "--volumes", "c"]);
        assert_eq!(state("c"), ["inspect", "--type", "container", "--format", "{{.State.Status}}", "c"]);
    }

    #[test]
    fn the_list_filters_on_the_runner_label() {
        assert_eq!(
            list("r1"),
            [
                "ps",
                "--all",
                "--no-trunc",
                "--filter",
                "label=dev.knotless.runner=r1",
                "--format",
                "{{.Names}}\t{{.Label \"dev.knotless.session\"}}\t{{.Label \"dev.knotless.owner\"}}"
            ]
        );
    }

    #[test]
    fn label_values_lose_control_characters() {
        assert_eq!(label_value("a\nb\tc"), "a b c");
    }
}
