//! `knotless-run kubeconfig scoped|check`: the Kubernetes executor's scoped credential, made
//! and checked by the Kubernetes executor's own program (`scoped-kubeconfig`,
//! `check-kubeconfig`) over the same client the executor runs Jobs with. The runner itself
//! speaks to no cluster.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};

use crate::host::PluginSearch;

/// `kubeconfig` subcommands.
#[derive(Debug, Subcommand)]
pub enum KubeconfigCommand {
    /// Make the runner's scoped kubeconfig from an admin kubeconfig: a ServiceAccount, a
    /// namespaced Role (jobs, pods, pods/log, pods/exec, events, networkpolicies; no secrets,
    /// nothing cluster-wide), its RoleBinding, and a token of --duration, written atomically
    /// (mode 0600) once checked.
    Scoped(ScopedArgs),
    /// Say what a kubeconfig's credential may do in a namespace; fails unless it may create
    /// Jobs, pods/exec and NetworkPolicies and delete collections of pods, and may not read
    /// secrets or nodes.
    Check(CheckArgs),
}

/// `kubeconfig scoped` arguments.
#[derive(Debug, Args)]
pub struct ScopedArgs {
    /// The admin kubeconfig.
    pub admin: PathBuf,
    /// The namespace of the runs.
    pub namespace: String,
    /// Where the scoped kubeconfig goes.
    pub output: PathBuf,
    /// The ServiceAccount, Role and RoleBinding name.
    #[arg(default_value = "knotless-runner")]
    pub account: String,
    /// The token's lifetime: `24h`, `90m`, `3600s`.
    #[arg(long, default_value = "24h")]
    pub duration: String,
    /// The user (`USER` or `USER:GROUP`) that gets the file.
    #[arg(long, value_name = "USER[:GROUP]")]
    pub owner: Option<String>,
    /// Where the executors are.
    #[arg(long, value_name = "DIR", default_value = "/usr/libexec/knotless")]
    pub plugin_dir: PathBuf,
}

/// `kubeconfig check` arguments.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The kubeconfig.
    pub kubeconfig: PathBuf,
    /// The namespace of the runs.
    pub namespace: String,
    /// Where the executors are.
    #[arg(long, value_name = "DIR", default_value = "/usr/libexec/knotless")]
    pub plugin_dir: PathBuf,
}

/// Runs the subcommand through the Kubernetes executor's program.
pub async fn main(command: KubeconfigCommand) -> anyhow::Result<ExitCode> {
    let (plugin_dir, args): (PathBuf, Vec<std::ffi::OsString>) = match command {
        KubeconfigCommand::Scoped(args) => {
            let mut argv: Vec<std::ffi::OsString> = vec![
                "scoped-kubeconfig".into(),
                args.admin.into(),
                args.namespace.into(),
                args.output.into(),
                args.account.into(),
                "--duration".into(),
                args.duration.into(),
            ];
            if let Some(owner) = args.owner {
                argv.extend(["--owner".into(), owner.into()]);
            }
            (args.plugin_dir, argv)
        }
        KubeconfigCommand::Check(args) => {
            (args.plugin_dir, vec!["check-kubeconfig".into(), args.kubeconfig.into(), args.namespace.into()])
        }
    };
    let program = PluginSearch::from_environment(plugin_dir).find("kubernetes")?;
    let status = tokio::process::Command::new(&program)
        .args(&args)
        .status()
        .await
        .with_context(|| format!("cannot run {}", program.display()))?;
    Ok(if status.success() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
