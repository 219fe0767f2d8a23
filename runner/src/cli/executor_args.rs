//! The flags that choose and configure an executor, shared by every subcommand that runs one,
//! and their translation into the host's configuration (executor options go in `initialize`,
//! where the executor validates them).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;
use knotless_protocol::messages::RunnerInfo;

use crate::host::{HostConfig, PluginSearch, ProcessSpec};

/// Where installed executors live unless `--plugin-dir` says otherwise.
pub const PLUGIN_DIR: &str = "/usr/libexec/knotless";

/// Choosing and configuring the executor.
#[derive(Debug, Clone, Args)]
pub struct ExecutorArgs {
    /// The executor: kubernetes, docker, shell, or the NAME of any installed
    /// knotless-executor-NAME.
    #[arg(long, value_name = "NAME", help_heading = "Executor")]
    pub executor: Option<String>,
    /// The path of an executor program, instead of --executor.
    #[arg(long, value_name = "PATH", conflicts_with = "executor", help_heading = "Executor")]
    pub executor_plugin: Option<PathBuf>,
    /// Where installed executors live [default: /usr/libexec/knotless; for `run`, `plugin-dir`
    /// of run.toml first].
    #[arg(long, value_name = "DIR", help_heading = "Executor")]
    pub plugin_dir: Option<PathBuf>,
    /// An executor option, passed to the executor in its handshake (repeatable).
    #[arg(long = "executor-option", value_name = "KEY=VALUE", help_heading = "Executor")]
    pub executor_options: Vec<String>,
    /// A variable of the runner's environment to pass to the executor (repeatable); others
    /// are withheld.
    #[arg(long = "executor-env", value_name = "NAME", help_heading = "Executor")]
    pub executor_env: Vec<String>,
    /// Seconds an executor gets after a deadline before it is cancelled, then stopped with
    /// SIGTERM, then SIGKILL.
    #[arg(long, value_name = "SECONDS", default_value_t = 10, help_heading = "Executor")]
    pub executor_grace: u64,
    /// This runner's id: the executor labels what it creates with it, and cleanup removes only
    /// what carries it.
    #[arg(long, value_name = "ID", help_heading = "Executor")]
    pub runner_id: Option<String>,
    /// Keep environments after their runs, for debugging: each is marked kept, and later runs'
    /// sweeps leave it until you remove it (`docker rm -f` the container, `kubectl delete job`
    /// the Job, or remove the session folder); a Kubernetes Job still ends at its run's deadline.
    #[arg(long, help_heading = "Executor")]
    pub keep: bool,
    /// The default image of environments (workflows may name their own).
    #[arg(long, value_name = "IMAGE", help_heading = "Executor")]
    pub image: Option<String>,
    /// The kubeconfig the Kubernetes executor uses.
    #[arg(long, value_name = "PATH", help_heading = "Kubernetes executor")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context.
    #[arg(long, value_name = "NAME", help_heading = "Kubernetes executor")]
    pub context: Option<String>,
    /// The namespace of the Jobs.
    #[arg(long, value_name = "NAME", help_heading = "Kubernetes executor")]
    pub namespace: Option<String>,
    /// The CPU request of a Job's pod (a Kubernetes quantity).
    #[arg(long, value_name = "QUANTITY", help_heading = "Kubernetes executor")]
    pub cpu_request: Option<String>,
    /// The memory request of a Job's pod (a Kubernetes quantity).
    #[arg(long, value_name = "QUANTITY", help_heading = "Kubernetes executor")]
    pub memory_request: Option<String>,
    /// The service account of a Job's pod.
    #[arg(long, value_name = "NAME", help_heading = "Kubernetes executor")]
    pub service_account: Option<String>,
    /// A node selector of a Job's pod (repeatable).
    #[arg(long, value_name = "KEY=VALUE", help_heading = "Kubernetes executor")]
    pub node_selector: Vec<String>,
}

impl ExecutorArgs {
    /// The executor's name: `--executor`, the plugin's file name, or `default`.
    pub fn executor_name(&self, default: &str) -> String {
        if let Some(name) = &self.executor {
            return name.clone();
        }
        if let Some(path) = &self.executor_plugin {
            let file = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
            return file.strip_prefix("knotless-executor-").unwrap_or(&file).to_string();
        }
        default.to_string()
    }

    /// The options sent in `initialize`: only the flags given, named as the flags are.
    pub fn options(&self) -> anyhow::Result<BTreeMap<String, String>> {
        let mut options = BTreeMap::new();
        let mut put = |key: &str, value: Option<String>| {
            if let Some(value) = value {
                options.insert(key.to_string(), value);
            }
        };
        let path = |path: &Option<PathBuf>| path.as_ref().map(|path| path.display().to_string());
        put("image", self.image.clone());
        put("kubeconfig", path(&self.kubeconfig));
        put("context", self.context.clone());
        put("namespace", self.namespace.clone());
        put("cpu-request", self.cpu_request.clone());
        put("memory-request", self.memory_request.clone());
        put("service-account", self.service_account.clone());
        if !self.node_selector.is_empty() {
            for selector in &self.node_selector {
                if !selector.contains('=') {
                    bail!("--node-selector {selector:?}: expected KEY=VALUE");
                }
            }
            put("node-selector", Some(self.node_selector.join(",")));
        }
        for option in &self.executor_options {
            let Some((key, value)) = option.split_once('=') else {
                bail!("--executor-option {option:?}: expected KEY=VALUE");
            };
            if key.is_empty() {
                bail!("--executor-option {option:?}: the key is empty");
            }
            options.insert(key.to_string(), value.to_string());
        }
        Ok(options)
    }

    /// The host configuration for this runner, with `default_executor` when none is named.
    pub fn host_config(&self, default_executor: &str, default_runner_id: &str) -> anyhow::Result<HostConfig> {
        let name = self.executor_name(default_executor);
        let path = match &self.executor_plugin {
            Some(path) => {
                if !crate::host::is_executable(path) {
                    bail!("--executor-plugin {}: not an executable file", path.display());
                }
                path.clone()
            }
            None => PluginSearch::from_environment(self.plugin_dir.clone().unwrap_or_else(|| PLUGIN_DIR.into()))
                .find(&name)?,
        };
        let runner_id = self.runner_id.clone().unwrap_or_else(|| default_runner_id.to_string());
        if runner_id.is_empty()
            || runner_id.len() > 63
            || !runner_id.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            bail!("--runner-id {runner_id:?}: use 1 to 63 letters, digits, '-', '_' or '.'");
        }
        let runner =
            RunnerInfo { name: "knotless-run".into(), version: env!("CARGO_PKG_VERSION").into(), id: runner_id };
        let process = ProcessSpec { name, path, pass_env: self.executor_env.clone() };
        let mut config = HostConfig::new(process, runner, self.options().context("bad executor options")?);
        // An option from --executor-option is named so in the executor's refusal; one from its
        // own flag is `--KEY`, as executors name options.
        config.option_flags = self
            .executor_options
            .iter()
            .filter_map(|option| option.split_once('='))
            .map(|(key, _)| (key.to_string(), crate::host::executor_option_flag(key)))
            .collect();
        config.grace = Duration::from_secs(self.executor_grace.max(1));
        // A run's executor fault stays in that run.
        config.process_per_session = true;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::ExecutorArgs;

    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        executor: ExecutorArgs,
    }

    fn options(args: &[&str]) -> Vec<(String, String)> {
        let flags = Flags::try_parse_from(["knotless-run"].iter().chain(args)).expect("the flags parse");
        flags.executor.options().expect("the options").into_iter().collect()
    }

    #[test]
    fn only_the_flags_given_become_options_and_the_reference_lists_each() {
        assert_eq!(options(&[]), []);
        let all = options(&[
            "--image=i",
            "--kubeconfig=/k",
            "--context=c",
            "--namespace=n",
            "--cpu-request=1",
            "--memory-request=1Mi",
            "--service-account=s",
            "--node-selector=a=b",
            "--node-selector=c=d",
            "--executor-option=work-dir=/w",
            "--executor-option=namespace=over",
        ]);
        let expected = [
            ("context", "c"),
            ("cpu-request", "1"),
            ("image", "i"),
            ("kubeconfig", "/k"),
            ("memory-request", "1Mi"),
            ("namespace", "over"),
            ("node-selector", "a=b,c=d"),
            ("service-account", "s"),
            ("work-dir", "/w"),
        ];
        let expected: Vec<_> = expected.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect();
        assert_eq!(all, expected);
        let reference = include_str!("../../../docs/reference/cli.md");
        let section = reference
            .split_once("\n## Executor options\n")
            .and_then(|(_, rest)| rest.split("\n## ").next())
            .expect("docs/reference/cli.md has a section Executor options");
        for (key, _) in all.iter().filter(|(key, _)| key != "work-dir") {
            assert!(section.contains(&format!("| `{key}` |")), "the section Executor options lacks {key}");
        }
    }
}
