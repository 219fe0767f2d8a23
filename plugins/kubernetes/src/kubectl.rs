//! The kubectl client: argv built by pure functions, and calls run with a cleared environment
//! (`PATH`, `HOME`, `LANG` only), so no value of the executor's environment reaches kubectl.
//!
//! Every call names `--kubeconfig`, `--context` and `-n`; the kubeconfig is read by kubectl
//! anew each time, so a refreshed file takes effect without a restart.

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use knotless_protocol::ExecutorError;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::config::Config;
use crate::manifest::CONTAINER;

/// How to reach the cluster.
#[derive(Debug, Clone)]
pub struct Kubectl {
    program: PathBuf,
    kubeconfig: PathBuf,
    context: Option<String>,
    /// The namespace of every call.
    pub namespace: String,
    path_env: String,
    home: String,
}

/// What a finished kubectl call gave.
#[derive(Debug)]
pub struct Output {
    /// Its exit status.
    pub status: ExitStatus,
    /// Its stdout.
    pub stdout: Vec<u8>,
    /// Its stderr.
    pub stderr: Vec<u8>,
}

impl Output {
    /// Stderr as one trimmed line of text.
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).trim().replace('\n', " | ")
    }
}

impl Kubectl {
    /// The client of a configuration.
    pub fn new(config: &Config) -> Kubectl {
        Kubectl {
            program: config.kubectl.clone(),
            kubeconfig: config.kubeconfig.clone(),
            context: config.context.clone(),
            namespace: config.namespace.clone(),
            path_env: config.path_env.clone(),
            home: config.home.clone(),
        }
    }

    /// The whole argv after the program: the global flags, then `args`.
    pub fn argv(&self, args: &[String]) -> Vec<String> {
        let mut argv = vec!["--kubeconfig".to_string(), self.kubeconfig.display().to_string()];
        if let Some(context) = &self.context {
            argv.extend(["--context".to_string(), context.clone()]);
        }
        argv.extend(["-n".to_string(), self.namespace.clone()]);
        argv.extend(args.iter().cloned());
        argv
    }

    /// A command for `args`, environment cleared, killed when dropped.
    pub fn command(&self, args: &[String]) -> Command {
        let mut command = Command::new(&self.program);
        command
            .args(self.argv(args))
            .env_clear()
            .env("PATH", &self.path_env)
            .env("HOME", &self.home)
            .env("LANG", "C.UTF-8")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    /// Runs `args` to its end, with `stdin` written when given, within `limit`.
    pub async fn run(&self, args: &[String], stdin: Option<&[u8]>, limit: Duration) -> Result<Output, ExecutorError> {
        let what = describe(args);
        let mut command = self.command(args);
        if stdin.is_some() {
            command.stdin(Stdio::piped());
        }
        let mut child = command.spawn().map_err(|error| {
            ExecutorError::infrastructure(format!("cannot run {} for {what}: {error}", self.program.display()))
        })?;
        if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
            // A kubectl that exits early closes its stdin; its stderr says why.
            let _ = pipe.write_all(bytes).await;
            drop(pipe);
        }
        let output = tokio::time::timeout(limit, child.wait_with_output()).await.map_err(|_| {
            ExecutorError::infrastructure(format!("kubectl {what} did not answer within {} s", limit.as_secs()))
        })?;
        let output = output.map_err(|error| ExecutorError::infrastructure(format!("kubectl {what}: {error}")))?;
        tracing::debug!(call = %what, status = ?output.status.code(), "kubectl");
        Ok(Output { status: output.status, stdout: output.stdout, stderr: output.stderr })
    }

    /// [`Kubectl::run`], where a non-zero exit is an infrastructure error quoting stderr.
    pub async fn ok(&self, args: &[String], stdin: Option<&[u8]>, limit: Duration) -> Result<Output, ExecutorError> {
        let output = self.run(args, stdin, limit).await?;
        if output.status.success() { Ok(output) } else { Err(failed(args, &output)) }
    }
}

/// The error of a failed call: what was asked, and kubectl's stderr; an expired or revoked
/// credential is named as such.
pub fn failed(args: &[String], output: &Output) -> ExecutorError {
    let stderr = output.stderr_text();
    let hint = if is_unauthorized(&stderr) {
        " (the cluster refused the credential: is the kubeconfig's token expired? refresh it)"
    } else if stderr.contains("Forbidden") || stderr.contains("forbidden") {
        " (the credential lacks the permission: see deploy/scoped-kubeconfig.sh)"
    } else {
        ""
    };
    ExecutorError::infrastructure(format!("kubectl {} failed{hint}: {stderr}", describe(args)))
}

/// Whether kubectl's stderr says the credential was refused.
pub fn is_unauthorized(stderr: &str) -> bool {
    stderr.contains("Unauthorized") || stderr.contains("must be logged in")
}

/// The first words of a call, for messages: verb and object, never stdin.
fn describe(args: &[String]) -> String {
    args.iter().take_while(|arg| arg.as_str() != "--").take(4).cloned().collect::<Vec<_>>().join(" ")
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|item| item.to_string()).collect()
}

/// `apply -f -`: the manifest comes on stdin.
pub fn apply_args() -> Vec<String> {
    strings(&["apply", "-f", "-"])
}

/// The pods of a run, as JSON.
pub fn get_pods_args(selector: &str) -> Vec<String> {
    strings(&["get", "pods", "-l", selector, "-o", "json"])
}

/// One pod, as JSON.
pub fn get_pod_args(pod: &str) -> Vec<String> {
    strings(&["get", "pod", pod, "-o", "json"])
}

/// The Jobs matching a selector, as JSON.
pub fn get_jobs_args(selector: &str) -> Vec<String> {
    strings(&["get", "jobs", "-l", selector, "-o", "json"])
}

/// The events about one object, as JSON.
pub fn get_events_args(name: &str) -> Vec<String> {
    let selector = format!("involvedObject.name={name}");
    strings(&["get", "events", "--field-selector", &selector, "-o", "json"])
}

/// Deletes Jobs and, first, their pods (foreground cascade), waiting for them to go.
pub fn delete_jobs_args(names: &[String]) -> Vec<String> {
    let mut args = strings(&["delete", "job"]);
    args.extend(names.iter().cloned());
    args.extend(strings(&["--ignore-not-found", "--cascade=foreground", "--wait=true"]));
    args
}

/// Deletes the pods matching a selector (pods a deleted Job left).
pub fn delete_pods_args(selector: &str) -> Vec<String> {
    strings(&["delete", "pods", "-l", selector, "--ignore-not-found", "--wait=false"])
}

/// Deletes the runner's NetworkPolicy.
pub fn delete_policy_args(name: &str) -> Vec<String> {
    strings(&["delete", "networkpolicy", name, "--ignore-not-found"])
}

/// `exec -i <pod> -c run -- <command...>`.
pub fn exec_args(pod: &str, command: &[&str]) -> Vec<String> {
    let mut args = strings(&["exec", "-i", pod, "-c", CONTAINER, "--"]);
    args.extend(strings(command));
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client() -> Kubectl {
        Kubectl {
            program: PathBuf::from("kubectl"),
            kubeconfig: PathBuf::from("/etc/k.yaml"),
            context: Some("tenant".into()),
            namespace: "runs".into(),
            path_env: "/bin".into(),
            home: "/root".into(),
        }
    }

    #[test]
    fn every_call_names_the_kubeconfig_context_and_namespace() {
        let argv = client().argv(&get_pods_args("a=b"));
        assert_eq!(
            argv,
            strings(&[
                "--kubeconfig",
                "/etc/k.yaml",
                "--context",
                "tenant",
                "-n",
                "runs",
                "get",
                "pods",
                "-l",
                "a=b",
                "-o",
                "json"
            ])
        );
    }

    #[test]
    fn argv_shapes() {
        assert_eq!(exec_args("p", &["sh", "-s"]), strings(&["exec", "-i", "p", "-c", "run", "--", "sh", "-s"]));
        assert_eq!(
            delete_jobs_args(&["j1".into(), "j2".into()]),
            strings(&["delete", "job", "j1", "j2", "--ignore-not-found", "--cascade=foreground", "--wait=true"])
        );
        assert_eq!(
            get_events_args("pod-1"),
            strings(&["get", "events", "--field-selector", "involvedObject.name=pod-1", "-o", "json"])
        );
        assert_eq!(describe(&exec_args("p", &["sh", "-s"])), "exec -i p -c");
    }

    #[test]
    fn an_expired_token_is_named() {
        assert!(is_unauthorized("error: You must be logged in to the server (Unauthorized)"));
        assert!(!is_unauthorized("Error from server (NotFound)"));
    }
}
