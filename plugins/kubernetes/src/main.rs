//! The `knotless-executor-kubernetes` binary: logs to stderr and serves the protocol on stdin
//! and stdout; or, called as `scoped-kubeconfig` or `check-kubeconfig` (what
//! `knotless-run kubeconfig scoped|check` runs), makes or checks the runner's scoped
//! credential ([`knotless_executor_kubernetes::credential`]).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use knotless_executor_kubernetes::KubernetesExecutor;
use knotless_executor_kubernetes::credential::{self, Scoped};

#[derive(Debug, Parser)]
#[command(
    name = "knotless-executor-kubernetes",
    version = knotless_protocol::version_line!(),
    about = "The Kubernetes executor of knotless-run"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Tool>,
}

#[derive(Debug, Subcommand)]
enum Tool {
    /// Make the runner's scoped kubeconfig from an admin kubeconfig.
    ScopedKubeconfig {
        /// The admin kubeconfig.
        admin: PathBuf,
        /// The namespace of the runs.
        namespace: String,
        /// Where the scoped kubeconfig goes (replaced atomically).
        output: PathBuf,
        /// The ServiceAccount, Role and RoleBinding name.
        #[arg(default_value = "knotless-runner")]
        account: String,
        /// The token's lifetime: `24h`, `90m`, `3600s`.
        #[arg(long, default_value = "24h")]
        duration: String,
        /// The user (`USER` or `USER:GROUP`) that gets the file.
        #[arg(long)]
        owner: Option<String>,
    },
    /// Check what a kubeconfig's credential may do in a namespace.
    CheckKubeconfig {
        /// The kubeconfig.
        kubeconfig: PathBuf,
        /// The namespace of the runs.
        namespace: String,
    },
}

/// `--duration`: a duration as workflows write one (`24h`, `90m`, `3600s`), in seconds.
fn seconds(text: &str) -> Result<i64, String> {
    knotless_protocol::duration::parse_duration(text)
        .and_then(|duration| i64::try_from(duration.as_secs()).ok())
        .ok_or_else(|| format!("--duration {text:?}: {}", knotless_protocol::duration::DURATION_HINT))
}

fn owner(text: &str) -> Result<(u32, u32), String> {
    let (user, group) = text.split_once(':').map_or((text, None), |(user, group)| (user, Some(group)));
    let found =
        nix::unistd::User::from_name(user).ok().flatten().ok_or_else(|| format!("--owner {text}: no user {user}"))?;
    let gid = match group {
        None => found.gid.as_raw(),
        Some(group) => nix::unistd::Group::from_name(group)
            .ok()
            .flatten()
            .ok_or_else(|| format!("--owner {text}: no group {group}"))?
            .gid
            .as_raw(),
    };
    Ok((found.uid.as_raw(), gid))
}

async fn tool(tool: Tool) -> Result<(), String> {
    match tool {
        Tool::ScopedKubeconfig { admin, namespace, output, account, duration, owner: who } => {
            let seconds = seconds(&duration)?;
            let who = who.as_deref().map(owner).transpose()?;
            let what = Scoped { admin, namespace, output, account, seconds };
            let said = credential::scoped(&what, who).await.map_err(|error| format!("{error:#}"))?;
            println!("scoped-kubeconfig: {said}");
            Ok(())
        }
        Tool::CheckKubeconfig { kubeconfig, namespace } => {
            let answers = credential::check(&kubeconfig, &namespace).await.map_err(|error| format!("{error:#}"))?;
            for (said, right) in &answers {
                println!("{said}{}", if *right { "" } else { "  (wrong)" });
            }
            if answers.iter().all(|(_, right)| *right) {
                Ok(())
            } else {
                Err("the credential is not scoped as the runner needs".into())
            }
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    knotless_protocol::sdk::init_logging();
    let cli = Cli::parse();
    match cli.command {
        Some(command) => match tool(command).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("{error}");
                ExitCode::FAILURE
            }
        },
        None => match knotless_protocol::sdk::serve(KubernetesExecutor::default()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("{error:#}");
                ExitCode::FAILURE
            }
        },
    }
}
