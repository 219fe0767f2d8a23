//! `fake-kubectl`: a stateful fake of the `kubectl` calls the Kubernetes executor and the
//! deploy scripts make, for tests.
//!
//! The state folder is the kubeconfig's cluster `server: fake:///abs/state/folder`. It holds
//! `store.json` (the objects), `calls.jsonl` (every argv, environment and stdin received),
//! `inject.json` (failures to inject), `rootfs.tar` (the pods' root filesystem) and `pods/`
//! (each pod's root folder, kept after the pod is gone so tests can search it).
//!
//! Injections: `image-missing`, `pull-denied`, `unschedulable` (the pod never becomes Ready),
//! `node-lost-after-ready`, `job-deleted-mid-step`, `drop-exec-stream` (fire once, mid-step),
//! `policy-denied` (applying a NetworkPolicy is Forbidden), `token-expired` (every call is
//! Unauthorized).

mod admin;
mod exec;
mod objects;
mod pods;
mod store;

use std::io::Read;
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use serde_json::Value;

/// The global flags of a call and what is left.
#[derive(Debug, Default)]
pub struct Call {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub namespace: Option<String>,
    pub args: Vec<String>,
}

/// Takes `--kubeconfig`, `--context`, `-n`/`--namespace` from anywhere before `--`.
pub fn parse(argv: &[String]) -> Call {
    let mut call = Call::default();
    let mut iter = argv.iter();
    while let Some(arg) = iter.next() {
        if arg == "--" {
            call.args.push(arg.clone());
            call.args.extend(iter.by_ref().cloned());
            break;
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, Some(value.to_string())),
            _ => (arg.as_str(), None),
        };
        match flag {
            "--kubeconfig" | "--context" | "-n" | "--namespace" => {
                let value = inline.or_else(|| iter.next().cloned()).unwrap_or_default();
                match flag {
                    "--kubeconfig" => call.kubeconfig = Some(PathBuf::from(value)),
                    "--context" => call.context = Some(value),
                    _ => call.namespace = Some(value),
                }
            }
            _ => call.args.push(arg.clone()),
        }
    }
    call
}

/// The kubeconfig's state folder and the token of its user.
pub struct Cluster {
    pub dir: PathBuf,
    pub token: Option<String>,
    pub namespace: Option<String>,
}

fn cluster(call: &Call) -> anyhow::Result<Cluster> {
    let path = call.kubeconfig.clone().context("error: fake-kubectl needs --kubeconfig")?;
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("error: stat {}: no such file or directory", path.display()))?;
    let config: Value =
        serde_saphyr::from_str(&text).with_context(|| format!("error loading config file {}", path.display()))?;
    let context_name = call.context.clone().unwrap_or_else(|| store::text(&config, "/current-context").to_string());
    let named = |list: &str, name: &str| {
        config
            .get(list)
            .and_then(Value::as_array)
            .and_then(|items| items.iter().find(|item| store::text(item, "/name") == name))
            .cloned()
    };
    let context = named("contexts", &context_name)
        .with_context(|| format!("error: context \"{context_name}\" does not exist"))?;
    let cluster =
        named("clusters", store::text(&context, "/context/cluster")).context("error: no cluster in the context")?;
    let server = store::text(&cluster, "/cluster/server");
    let Some(dir) = server.strip_prefix("fake://") else {
        bail!("error: fake-kubectl serves only fake:// servers, not {server}")
    };
    let user = named("users", store::text(&context, "/context/user"));
    let token =
        user.as_ref().map(|user| store::text(user, "/user/token").to_string()).filter(|token| !token.is_empty());
    let namespace = Some(store::text(&context, "/context/namespace").to_string()).filter(|ns| !ns.is_empty());
    Ok(Cluster { dir: PathBuf::from(dir), token, namespace })
}

fn run(argv: Vec<String>) -> anyhow::Result<i32> {
    let call = parse(&argv);
    let cluster = cluster(&call)?;
    let namespace = call.namespace.clone().or(cluster.namespace.clone()).unwrap_or_else(|| "default".into());
    let verb = call.args.first().cloned().unwrap_or_default();
    let reads_stdin = matches!(verb.as_str(), "apply" | "create" | "replace") && call.args.iter().any(|arg| arg == "-");
    let stdin = if reads_stdin {
        let mut bytes = Vec::new();
        std::io::stdin().read_to_end(&mut bytes)?;
        Some(bytes)
    } else {
        None
    };
    if verb != "exec" {
        store::log_call(&cluster.dir, &argv, stdin.as_deref());
    }
    let injected = store::injected(&cluster.dir);
    if injected.contains("token-expired") || admin::token_expired(&cluster) {
        if verb == "exec" {
            store::log_call(&cluster.dir, &argv, None);
        }
        bail!("error: You must be logged in to the server (Unauthorized)");
    }
    let rest = &call.args[1.min(call.args.len())..];
    match verb.as_str() {
        "apply" | "create" if stdin.is_some() => {
            objects::apply(&cluster.dir, &namespace, &stdin.unwrap_or_default(), verb == "create", &injected)
        }
        "create" => admin::create(&cluster, &namespace, rest),
        "get" => objects::get(&cluster.dir, &namespace, rest),
        "delete" => objects::delete(&cluster.dir, &namespace, rest),
        "exec" => exec::exec(&cluster.dir, &argv, &namespace, rest),
        "auth" => admin::can_i(&cluster, &namespace, rest),
        "config" => admin::config(&call, rest),
        other => bail!("error: fake-kubectl does not know the command {other:?}"),
    }
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    match run(argv) {
        Ok(code) => std::process::exit(code),
        Err(error) => {
            eprintln!("{error:#}");
            std::process::exit(1);
        }
    }
}
