//! The semantic checks of a workflow, run on what serde accepted: each error located by file,
//! line, column and field.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use knotless_protocol::messages::Service;
use serde_saphyr::Spanned;

use super::{DurationRaw, EnvRaw, MAX_COMBINATIONS, MatrixRaw, OnRaw, ServiceRaw, StepRaw, StrictBool, WorkflowRaw};
use crate::workflow::condition::{Condition, Scope};
use crate::workflow::locate::Position;
use crate::workflow::{
    BranchFilter, DEFAULT_HEALTH_TIMEOUT, DEFAULT_TIMEOUT, Event, ManualTrigger, RESERVED_PREFIX, Resources, Shell,
    Step, Triggers, Workflow, WorkflowError, first_duplicate, is_host_label, is_variable_name,
};

/// An error at `position`, naming the field `path`.
pub(super) fn at_position(file: &str, position: Position, path: &str, message: &str) -> WorkflowError {
    WorkflowError {
        file: file.to_string(),
        line: Some(position.line),
        column: Some(position.column),
        message: if path.is_empty() { message.to_string() } else { format!("{path}: {message}") },
    }
}

/// Every choice of one value per variable of the matrix, in the order written (none when it has
/// no variables), and at most one past the most a matrix may have, so that too many is seen
/// without making them all.
fn every_combination(raw: &MatrixRaw) -> Vec<Vec<(String, String)>> {
    if raw.variables.is_empty() {
        return Vec::new();
    }
    let mut combinations: Vec<Vec<(String, String)>> = vec![Vec::new()];
    for (variable, values) in &raw.variables {
        combinations = combinations
            .iter()
            .flat_map(|combination| {
                values.iter().map(move |value| {
                    let mut next = combination.clone();
                    next.push((variable.value.clone(), value.value.clone()));
                    next
                })
            })
            .take(MAX_COMBINATIONS + 1)
            .collect();
    }
    combinations
}

/// The semantic checks, run on what serde accepted.
pub(super) struct Check<'a> {
    pub(super) file: &'a str,
    /// The file's text, to see how a scalar was written.
    pub(super) text: &'a str,
}

impl Check<'_> {
    /// An error at a spanned value, or at `fallback` when serde-saphyr has no span for it.
    fn at<T>(&self, value: &Spanned<T>, fallback: Position, path: &str, message: &str) -> WorkflowError {
        at_position(self.file, Position::of(value.referenced).unwrap_or(fallback), path, message)
    }

    pub(super) fn workflow(&self, name: &str, root: Position, raw: WorkflowRaw) -> Result<Workflow, WorkflowError> {
        let on = match &raw.on {
            Some(on) => self.triggers(on, root)?,
            None => Triggers::default(),
        };
        if let Some(image) = &raw.image {
            self.not_blank(image, root, "image")?;
        }
        let network = match &raw.network {
            Some(network) => self.boolean(network, root, "network")?,
            None => false,
        };
        let resources = match raw.resources {
            Some(resources) => Resources {
                cpu: self.quantity(resources.cpu, root, "resources.cpu")?,
                memory: self.quantity(resources.memory, root, "resources.memory")?,
            },
            None => Resources::default(),
        };
        let timeout = match &raw.timeout {
            Some(timeout) => self.timeout(timeout, root, "timeout")?,
            None => DEFAULT_TIMEOUT,
        };
        let env = self.env(raw.env, root, "env")?;
        if let Some(manual) = &on.manual
            && let Some(name) = manual.inputs.keys().find(|name| env.contains_key(*name))
        {
            let message = format!("input {name} is also set by the workflow's env: name it once");
            return Err(at_position(self.file, root, &format!("on.manual.inputs.{name}"), &message));
        }
        let matrix = match &raw.matrix {
            Some(matrix) => self.matrix(name, matrix, &env, root)?,
            None => Vec::new(),
        };
        let max_parallel = self.max_parallel(raw.matrix.as_ref(), root)?;
        let cache = raw.cache.unwrap_or_default();
        for (index, path) in cache.iter().enumerate() {
            self.cache_path(path, root, &format!("cache[{index}]"))?;
        }
        let runners = raw.runners.unwrap_or_default();
        for (index, runner) in runners.iter().enumerate() {
            self.not_blank(runner, root, &format!("runners[{index}]"))?;
        }
        let working_directory = match &raw.working_directory {
            Some(dir) => Some(self.working_directory(dir, root, "working-directory")?),
            None => None,
        };
        let needs = raw.needs.unwrap_or_default();
        self.needs(&needs, name, on.queue || raw.queue.is_some(), root)?;
        let condition = self.workflow_condition(raw.condition.as_ref(), on.queue || raw.queue.is_some(), root)?;
        let services = match raw.services {
            Some(services) => self.services(services, root)?,
            None => Vec::new(),
        };
        let steps = self.steps(raw.steps, root, working_directory.as_deref())?;
        Ok(Workflow {
            name: name.to_string(),
            file: self.file.to_string(),
            on,
            image: raw.image.map(|image| image.value),
            resources,
            timeout,
            env,
            cache: cache.into_iter().map(|path| path.value).collect(),
            runners: runners.into_iter().map(|runner| runner.value).collect(),
            queue: raw.queue,
            network,
            steps,
            matrix,
            max_parallel,
            base: None,
            needs: needs.into_iter().map(|need| need.value).collect(),
            condition,
            services,
        })
    }

    /// The workflow's `if`, which a merge-queue workflow may not have: it gates every batch and
    /// pre-flight.
    fn workflow_condition(
        &self,
        raw: Option<&Spanned<String>>,
        queue: bool,
        root: Position,
    ) -> Result<Option<Condition>, WorkflowError> {
        let condition = match raw {
            Some(condition) => Some(self.condition(condition, root, "if", Scope::Workflow)?),
            None => None,
        };
        if let (Some(condition), true) = (raw, queue) {
            let message = "a merge-queue workflow gates every batch and pre-flight: it takes no `if`";
            return Err(self.at(condition, root, "if", message));
        }
        Ok(condition)
    }

    /// `matrix.max-parallel`: at most this many combinations at once, 1 to the most a matrix has.
    fn max_parallel(
        &self,
        matrix: Option<&Spanned<MatrixRaw>>,
        root: Position,
    ) -> Result<Option<usize>, WorkflowError> {
        let Some(limit) = matrix.and_then(|matrix| matrix.value.max_parallel.as_ref()) else { return Ok(None) };
        let at = matrix.and_then(|matrix| Position::of(matrix.referenced)).unwrap_or(root);
        match usize::try_from(limit.value) {
            Ok(limit @ 1..=MAX_COMBINATIONS) => Ok(Some(limit)),
            _ => {
                let message = format!("runs at most this many combinations at once: 1 to {MAX_COMBINATIONS}");
                Err(self.at(limit, at, "matrix.max-parallel", &message))
            }
        }
    }

    /// `needs:`: other workflows' names, each once, never the workflow's own, and none in a
    /// merge-queue workflow.
    fn needs(&self, needs: &[Spanned<String>], name: &str, queue: bool, root: Position) -> Result<(), WorkflowError> {
        for (index, need) in needs.iter().enumerate() {
            let path = format!("needs[{index}]");
            self.not_blank(need, root, &path)?;
            if need.value == name {
                return Err(self.at(need, root, &path, "a workflow cannot need itself"));
            }
        }
        if let Some(index) = first_duplicate(needs.iter().map(|need| need.value.as_str())) {
            let message = format!("{:?} is listed twice", needs[index].value);
            return Err(self.at(&needs[index], root, &format!("needs[{index}]"), &message));
        }
        if let (Some(first), true) = (needs.first(), queue) {
            let message = "merge-queue pre-flights and batches run without waiting for other workflows: \
                           `needs` is for push and pull runs";
            return Err(self.at(first, root, "needs[0]", message));
        }
        Ok(())
    }

    /// `steps:`: at least one, each named once, each in the workflow's working directory unless
    /// it names its own.
    fn steps(
        &self,
        raw: Option<Spanned<Vec<Spanned<StepRaw>>>>,
        root: Position,
        working_directory: Option<&str>,
    ) -> Result<Vec<Step>, WorkflowError> {
        let Some(steps_raw) = raw else {
            return Err(at_position(self.file, root, "", "missing field `steps`"));
        };
        let steps_at = Position::of(steps_raw.referenced).unwrap_or(root);
        if steps_raw.value.is_empty() {
            return Err(at_position(self.file, steps_at, "steps", "a workflow needs at least one step"));
        }
        let mut steps = Vec::new();
        let mut names = BTreeSet::new();
        for (index, step) in steps_raw.value.into_iter().enumerate() {
            let path = format!("steps[{index}]");
            let step_at = Position::of(step.referenced).unwrap_or(steps_at);
            if !names.insert(step.value.name.value.clone()) {
                let message = format!("duplicate step name {:?}", step.value.name.value);
                return Err(self.at(&step.value.name, step_at, &format!("{path}.name"), &message));
            }
            let mut step = self.step(step.value, step_at, &path)?;
            if step.working_directory.is_none() {
                step.working_directory = working_directory.map(str::to_string);
            }
            steps.push(step);
        }
        Ok(steps)
    }

    /// `services:`: each named as a host name is (its steps reach it by that name), with an
    /// image, and a health timeout within the run's bounds.
    fn services(
        &self,
        raw: Spanned<BTreeMap<String, Spanned<ServiceRaw>>>,
        root: Position,
    ) -> Result<Vec<Service>, WorkflowError> {
        let at = Position::of(raw.referenced).unwrap_or(root);
        if raw.value.is_empty() {
            return Err(at_position(
                self.file,
                at,
                "services",
                "no services: name at least one, or leave `services` out",
            ));
        }
        let mut services = Vec::new();
        for (name, service) in raw.value {
            let path = format!("services.{name}");
            let service_at = Position::of(service.referenced).unwrap_or(at);
            if !is_host_label(&name) {
                let message = format!(
                    "invalid service name {name:?}: steps reach it by this name, so it is a host name: lowercase letters, \
                     digits and -, starting with a letter, at most 63 characters"
                );
                return Err(at_position(self.file, service_at, &path, &message));
            }
            let service = service.value;
            let Some(image) = service.image else {
                return Err(at_position(self.file, service_at, &path, "missing field `image`"));
            };
            self.not_blank(&image, service_at, &format!("{path}.image"))?;
            let command = match service.command {
                Some(command) if command.is_empty() => {
                    let message = "an empty command: give the program and its arguments, or leave `command` out";
                    return Err(at_position(self.file, service_at, &format!("{path}.command"), message));
                }
                Some(command) => Some(command.into_iter().map(|part| part.value).collect()),
                None => None,
            };
            if let Some(health) = &service.health {
                self.not_blank(health, service_at, &format!("{path}.health"))?;
            }
            let health_timeout = match &service.health_timeout {
                Some(timeout) => self.timeout(timeout, service_at, &format!("{path}.health-timeout"))?,
                None => DEFAULT_HEALTH_TIMEOUT,
            };
            services.push(Service {
                env: self.env(service.env, service_at, &format!("{path}.env"))?,
                name,
                image: image.value,
                command,
                health: service.health.map(|health| health.value),
                health_timeout_ms: health_timeout.as_millis() as u64,
            });
        }
        Ok(services)
    }

    /// A checked `if:` condition; an error names the line and column of the fault inside it.
    fn condition(
        &self,
        value: &Spanned<String>,
        fallback: Position,
        path: &str,
        scope: Scope,
    ) -> Result<Condition, WorkflowError> {
        Condition::parse(&value.value, scope).map_err(|error| {
            let start = Position::of(value.referenced).unwrap_or(fallback);
            at_position(self.file, self.inside(start, &value.value, error.offset), path, &error.message)
        })
    }

    /// Where byte `offset` of the scalar `value` starting at `start` is in the file: exact when
    /// the scalar is written on one line as it reads (plain, or quoted without escapes), its
    /// start otherwise.
    fn inside(&self, start: Position, value: &str, offset: usize) -> Position {
        let (Ok(line), Ok(column)) = (usize::try_from(start.line), usize::try_from(start.column)) else {
            return start;
        };
        let Some(line) = self.text.lines().nth(line.saturating_sub(1)) else {
            return start;
        };
        let written: String = line.chars().skip(column.saturating_sub(1)).collect();
        let quotes = if written.starts_with(value) {
            0
        } else if written.starts_with(['"', '\'']) && written[1..].starts_with(value) {
            1
        } else {
            return start;
        };
        let before = value.get(..offset).map_or(0, |before| before.chars().count());
        Position { line: start.line, column: start.column + quotes + before as u64 }
    }

    /// The matrix's variables' names, each a variable name the workflow's `env` does not set,
    /// with at least one value and each value once.
    fn matrix_variables(
        &self,
        raw: &MatrixRaw,
        env: &BTreeMap<String, String>,
        at: Position,
    ) -> Result<Vec<String>, WorkflowError> {
        let mut names: Vec<String> = Vec::new();
        for (variable, values) in &raw.variables {
            let path = format!("matrix.{}", variable.value);
            self.variable_name(variable, at, &path, "matrix variable")?;
            if variable.value == "CI" || env.contains_key(&variable.value) {
                let message = format!("{} is also set by the workflow's env or the run: name it once", variable.value);
                return Err(self.at(variable, at, &path, &message));
            }
            if values.is_empty() {
                return Err(self.at(variable, at, &path, "a matrix variable needs at least one value"));
            }
            for (index, value) in values.iter().enumerate() {
                self.matrix_value(value, at, &format!("{path}[{index}]"))?;
            }
            if let Some(index) = first_duplicate(values.iter().map(|value| value.value.as_str())) {
                let message = format!("value {:?} is listed twice", values[index].value);
                return Err(self.at(&values[index], at, &format!("{path}[{index}]"), &message));
            }
            names.push(variable.value.clone());
        }
        Ok(names)
    }

    /// An entry of `include` or `exclude` at `path`: its pairs, each naming a variable of the
    /// matrix (`include` may define them when the matrix has none).
    fn matrix_entry(
        &self,
        path: &str,
        entry: &EnvRaw,
        names: &[String],
        at: Position,
    ) -> Result<Vec<(String, String)>, WorkflowError> {
        let mut pairs = Vec::new();
        for (variable, value) in &entry.0 {
            let field = format!("{path}.{}", variable.value);
            self.variable_name(variable, at, &field, "matrix variable")?;
            if !names.is_empty() && !names.contains(&variable.value) {
                let message = format!("{} is not a variable of the matrix ({})", variable.value, names.join(", "));
                return Err(self.at(variable, at, &field, &message));
            }
            self.matrix_value(value, at, &field)?;
            pairs.push((variable.value.clone(), value.value.clone()));
        }
        Ok(pairs)
    }

    /// The combinations of `matrix:`: every choice of one value per variable in the order
    /// written, without those an `exclude` entry matches, then each `include` entry not already
    /// there. Each is checked as a workflow name would be.
    fn matrix(
        &self,
        name: &str,
        raw: &Spanned<MatrixRaw>,
        env: &BTreeMap<String, String>,
        root: Position,
    ) -> Result<Vec<Vec<(String, String)>>, WorkflowError> {
        let at = Position::of(raw.referenced).unwrap_or(root);
        let raw = &raw.value;
        let mut names = self.matrix_variables(raw, env, at)?;
        let entry = |kind: &str, index: usize, entry: &EnvRaw, names: &[String]| {
            self.matrix_entry(&format!("matrix.{kind}[{index}]"), entry, names, at)
        };
        let mut combinations = every_combination(raw);
        for (index, exclude) in raw.exclude.iter().enumerate() {
            let pairs = entry("exclude", index, exclude, &names)?;
            if pairs.is_empty() {
                return Err(at_position(
                    self.file,
                    at,
                    &format!("matrix.exclude[{index}]"),
                    "an empty entry would exclude everything",
                ));
            }
            combinations.retain(|combination| !pairs.iter().all(|pair| combination.contains(pair)));
        }
        for (index, include) in raw.include.iter().enumerate() {
            let mut pairs = entry("include", index, include, &names)?;
            if names.is_empty() {
                names = pairs.iter().map(|(variable, _)| variable.clone()).collect();
                if names.is_empty() {
                    return Err(at_position(
                        self.file,
                        at,
                        &format!("matrix.include[{index}]"),
                        "an entry needs variables",
                    ));
                }
            }
            let given: BTreeSet<&String> = pairs.iter().map(|(variable, _)| variable).collect();
            if given.len() != names.len() || names.iter().any(|variable| !given.contains(variable)) {
                let message = format!("an entry gives every variable of the matrix, once: {}", names.join(", "));
                return Err(at_position(self.file, at, &format!("matrix.include[{index}]"), &message));
            }
            pairs.sort_by_key(|(variable, _)| names.iter().position(|name| name == variable));
            if !combinations.contains(&pairs) {
                combinations.push(pairs);
            }
        }
        if combinations.is_empty() {
            return Err(at_position(self.file, at, "matrix", "no combination is left"));
        }
        if combinations.len() > MAX_COMBINATIONS {
            let message = format!("more than {MAX_COMBINATIONS} combinations: split the workflow");
            return Err(at_position(self.file, at, "matrix", &message));
        }
        for combination in &combinations {
            let cell = crate::workflow::matrix_name(name, combination);
            crate::workflow::check_name(&cell).map_err(|rule| {
                at_position(
                    self.file,
                    at,
                    "matrix",
                    &format!("the run {cell:?}: {}", rule.replace("(the file's stem) ", "")),
                )
            })?;
        }
        Ok(combinations)
    }

    /// A value of a matrix variable: it names a run, so it is not empty and holds no path
    /// separator and no control character.
    fn matrix_value(&self, value: &Spanned<String>, fallback: Position, path: &str) -> Result<(), WorkflowError> {
        self.not_blank(value, fallback, path)?;
        if value.value.contains(['/', '\\']) || value.value.chars().any(char::is_control) {
            let message = format!("value {:?} names a run: no path separator or control character", value.value);
            return Err(self.at(value, fallback, path, &message));
        }
        Ok(())
    }

    fn step(&self, raw: StepRaw, at: Position, path: &str) -> Result<Step, WorkflowError> {
        self.not_blank(&raw.name, at, &format!("{path}.name"))?;
        match (&raw.run, &raw.uses) {
            (None, None) => {
                return Err(at_position(self.file, at, path, "a step needs `run` or `uses`"));
            }
            (Some(_), Some(uses)) => {
                let message = "a step has either `run` or `uses`, not both";
                return Err(self.at(uses, at, &format!("{path}.uses"), message));
            }
            (Some(run), None) => self.not_blank(run, at, &format!("{path}.run"))?,
            (None, Some(uses)) => self.shared_step_name(uses, at, &format!("{path}.uses"))?,
        }
        let timeout = match &raw.timeout {
            Some(timeout) => Some(self.timeout(timeout, at, &format!("{path}.timeout"))?),
            None => None,
        };
        let secrets = raw.secrets.unwrap_or_default();
        for (index, secret) in secrets.iter().enumerate() {
            self.variable_name(secret, at, &format!("{path}.secrets[{index}]"), "secret")?;
        }
        if let Some(index) = first_duplicate(secrets.iter().map(|secret| secret.value.as_str())) {
            let message = format!("secret {:?} is listed twice", secrets[index].value);
            return Err(self.at(&secrets[index], at, &format!("{path}.secrets[{index}]"), &message));
        }
        let continue_on_error = match &raw.continue_on_error {
            Some(value) => self.boolean(value, at, &format!("{path}.continue-on-error"))?,
            None => false,
        };
        let working_directory = match &raw.working_directory {
            Some(dir) => Some(self.working_directory(dir, at, &format!("{path}.working-directory"))?),
            None => None,
        };
        let shell = match &raw.shell {
            None => Shell::Sh,
            Some(shell) => match shell.value.as_str() {
                "sh" => Shell::Sh,
                "bash" => Shell::Bash,
                other => {
                    let message = format!("unknown shell {other:?}, expected sh or bash");
                    return Err(self.at(shell, at, &format!("{path}.shell"), &message));
                }
            },
        };
        if let (Some(shell_at), Some(_)) = (&raw.shell, &raw.uses) {
            let message = "a shared step runs its own `run` program: `shell` is for `run` scripts";
            return Err(self.at(shell_at, at, &format!("{path}.shell"), message));
        }
        let env = self.env(raw.env, at, &format!("{path}.env"))?;
        let condition = match &raw.condition {
            Some(condition) => Some(self.condition(condition, at, &format!("{path}.if"), Scope::Step)?),
            None => None,
        };
        Ok(Step {
            name: raw.name.value,
            run: raw.run.map(|run| run.value),
            uses: raw.uses.map(|uses| uses.value),
            timeout,
            secrets: secrets.into_iter().map(|secret| secret.value).collect(),
            env,
            continue_on_error,
            working_directory,
            shell,
            condition,
        })
    }

    /// The patterns of `field` (`on.push.branches`), none blank; an empty list is `empty`,
    /// an error at the event's `name`.
    fn patterns(
        &self,
        name: &Spanned<String>,
        patterns: &[Spanned<String>],
        fallback: Position,
        field: &str,
        empty: &str,
    ) -> Result<Vec<String>, WorkflowError> {
        if patterns.is_empty() {
            return Err(self.at(name, fallback, field, empty));
        }
        for (index, pattern) in patterns.iter().enumerate() {
            self.not_blank(pattern, fallback, &format!("{field}[{index}]"))?;
        }
        Ok(patterns.iter().map(|pattern| pattern.value.clone()).collect())
    }

    fn triggers(&self, on: &Spanned<OnRaw>, root: Position) -> Result<Triggers, WorkflowError> {
        let on_at = Position::of(on.referenced).unwrap_or(root);
        let mut triggers = Triggers { push: None, pull: None, queue: false, manual: None };
        if on.value.0.is_empty() {
            return Err(at_position(self.file, on_at, "on", "no events, expected push, pull, queue or manual"));
        }
        let mut seen = BTreeSet::new();
        for (name, filter) in &on.value.0 {
            let path = format!("on.{}", name.value);
            let event: Event = name
                .value
                .parse()
                .map_err(|e: crate::workflow::UnknownEvent| self.at(name, on_at, "on", &e.to_string()))?;
            if !seen.insert(event) {
                let message = format!("event {event} is listed twice");
                return Err(self.at(name, on_at, "on", &message));
            }
            if event == Event::Manual {
                let filter = filter.as_ref();
                if filter.is_some_and(|filter| filter.branches.is_some() || filter.paths.is_some()) {
                    let message =
                        "a manual trigger takes no branches or paths (`knotless-run trigger --ref` names the branch)";
                    return Err(self.at(name, on_at, &path, message));
                }
                let inputs =
                    self.env(filter.and_then(|filter| filter.inputs.clone()), on_at, &format!("{path}.inputs"))?;
                triggers.manual = Some(ManualTrigger { inputs });
                continue;
            }
            if filter.as_ref().is_some_and(|filter| filter.inputs.is_some()) {
                let message = "only a manual trigger takes inputs";
                return Err(self.at(name, on_at, &path, message));
            }
            let branches = match filter.as_ref().and_then(|filter| filter.branches.as_ref()) {
                None => None,
                Some(_) if event == Event::Queue => {
                    let message = "a queue trigger takes no branches (batches are for the queue's branch)";
                    return Err(self.at(name, on_at, &path, message));
                }
                Some(patterns) => {
                    let empty = "no branch patterns; leave `branches` out to match every branch";
                    Some(self.patterns(name, patterns, on_at, &format!("{path}.branches"), empty)?)
                }
            };
            let paths = match filter.as_ref().and_then(|filter| filter.paths.as_ref()) {
                None => None,
                Some(_) if event == Event::Queue => {
                    let message = "a queue trigger takes no paths (a batch runs whatever it changes)";
                    return Err(self.at(name, on_at, &path, message));
                }
                Some(patterns) => {
                    let empty = "no path patterns; leave `paths` out to run whatever changed";
                    let values = self.patterns(name, patterns, on_at, &format!("{path}.paths"), empty)?;
                    for (index, pattern) in patterns.iter().enumerate() {
                        let field = format!("{path}.paths[{index}]");
                        let bare = pattern.value.strip_prefix('!').unwrap_or(&pattern.value);
                        if bare.is_empty() || bare.starts_with('/') {
                            let message =
                                "a path pattern is relative to the repository's root, like src/** or !docs/**";
                            return Err(self.at(pattern, on_at, &field, message));
                        }
                    }
                    if patterns[0].value.starts_with('!') {
                        let message = "the first path pattern takes back paths no pattern matched yet: start with the paths that run";
                        return Err(self.at(&patterns[0], on_at, &format!("{path}.paths[0]"), message));
                    }
                    Some(values)
                }
            };
            match event {
                Event::Push => triggers.push = Some(BranchFilter { branches, paths }),
                Event::Pull => triggers.pull = Some(BranchFilter { branches, paths }),
                Event::Queue => triggers.queue = true,
                Event::Manual => {}
            }
        }
        Ok(triggers)
    }

    fn env(
        &self,
        env: Option<EnvRaw>,
        fallback: Position,
        path: &str,
    ) -> Result<BTreeMap<String, String>, WorkflowError> {
        let mut variables = BTreeMap::new();
        for (name, value) in env.map(|env| env.0).unwrap_or_default() {
            let field = format!("{path}.{}", name.value);
            self.variable_name(&name, fallback, &field, "variable")?;
            variables.insert(name.value, value.value);
        }
        Ok(variables)
    }

    fn variable_name(
        &self,
        name: &Spanned<String>,
        fallback: Position,
        path: &str,
        what: &str,
    ) -> Result<(), WorkflowError> {
        if !is_variable_name(&name.value) {
            let message = format!(
                "invalid {what} name {:?}, expected letters, digits and _, not starting with a digit",
                name.value
            );
            return Err(self.at(name, fallback, path, &message));
        }
        if name.value.starts_with(RESERVED_PREFIX) {
            let message = format!(
                "{what} name {:?} is reserved: names starting with {RESERVED_PREFIX} are the runner's",
                name.value
            );
            return Err(self.at(name, fallback, path, &message));
        }
        Ok(())
    }

    fn timeout(
        &self,
        timeout: &Spanned<DurationRaw>,
        fallback: Position,
        path: &str,
    ) -> Result<Duration, WorkflowError> {
        if timeout.value.0.is_zero() {
            return Err(self.at(timeout, fallback, path, "timeout must be greater than zero"));
        }
        Ok(timeout.value.0)
    }

    fn not_blank(&self, text: &Spanned<String>, fallback: Position, path: &str) -> Result<(), WorkflowError> {
        if text.value.trim().is_empty() {
            return Err(self.at(text, fallback, path, "must not be empty"));
        }
        Ok(())
    }

    fn cache_path(&self, path_text: &Spanned<String>, fallback: Position, path: &str) -> Result<(), WorkflowError> {
        self.not_blank(path_text, fallback, path)?;
        if path_text.value.split('/').any(|part| part == "..") {
            let message = format!("cache path {:?} must not contain ..", path_text.value);
            return Err(self.at(path_text, fallback, path, &message));
        }
        Ok(())
    }

    /// A folder of the checkout: relative, without `..`, `.` or empty parts, and printable.
    fn working_directory(
        &self,
        dir: &Spanned<String>,
        fallback: Position,
        path: &str,
    ) -> Result<String, WorkflowError> {
        self.not_blank(dir, fallback, path)?;
        let text = dir.value.trim_end_matches('/');
        let bad = if text.starts_with('/') {
            Some("must be relative to the work folder")
        } else if text.split('/').any(|part| part.is_empty() || part == "." || part == "..") {
            Some("must not hold `..`, `.` or empty parts")
        } else if text.chars().any(char::is_control) {
            Some("must not hold control characters")
        } else {
            None
        };
        match bad {
            Some(why) => Err(self.at(dir, fallback, path, &format!("{:?} {why}", dir.value))),
            None => Ok(text.to_string()),
        }
    }

    fn shared_step_name(&self, uses: &Spanned<String>, fallback: Position, path: &str) -> Result<(), WorkflowError> {
        let name = &uses.value;
        let valid = !name.is_empty()
            && !name.starts_with('.')
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !valid {
            let message = format!(
                "invalid shared step {name:?}, expected the name of a folder of .knotless/steps/ (letters, digits, ., _ and -)"
            );
            return Err(self.at(uses, fallback, path, &message));
        }
        Ok(())
    }

    fn quantity(
        &self,
        quantity: Option<Spanned<String>>,
        fallback: Position,
        path: &str,
    ) -> Result<Option<String>, WorkflowError> {
        let Some(quantity) = quantity else {
            return Ok(None);
        };
        if knotless_protocol::sdk::quantity::parse(&quantity.value).is_none() {
            let message = format!("invalid quantity {:?}, expected e.g. 2, 500m, 4Gi", quantity.value);
            return Err(self.at(&quantity, fallback, path, &message));
        }
        Ok(Some(quantity.value))
    }
}

impl<'a> Check<'a> {
    /// The plain scalar starting at `at` as written (up to a space, `,`, `}`, `]` or `#`).
    fn scalar_at(&self, at: Position) -> Option<&'a str> {
        let line = self.text.lines().nth(usize::try_from(at.line).ok()?.checked_sub(1)?)?;
        let skip = usize::try_from(at.column).ok()?.checked_sub(1)?;
        let start = line.char_indices().nth(skip).map(|(index, _)| index)?;
        let rest = &line[start..];
        let end = rest.find([' ', '\t', ',', '}', ']', '#']).unwrap_or(rest.len());
        Some(&rest[..end])
    }

    /// A boolean field's value: `true` or `false` as YAML writes them, else an error at it.
    fn boolean(&self, value: &Spanned<StrictBool>, fallback: Position, path: &str) -> Result<bool, WorkflowError> {
        // YAML 1.1 spellings (`yes`, `on`, `True`) reach serde as booleans too: only the
        // written `true` and `false` are.
        let written = Position::of(value.referenced).and_then(|at| self.scalar_at(at));
        match &value.value {
            StrictBool::Bool(value) if written == Some(if *value { "true" } else { "false" }) => Ok(*value),
            StrictBool::Bool(_) => {
                let found = written.map_or_else(|| "another spelling".to_string(), |text| format!("`{text}`"));
                let message = format!("expected `true` or `false`, found {found}");
                Err(self.at(value, fallback, path, &message))
            }
            StrictBool::Other(written) => {
                let message = format!("expected `true` or `false`, found {written}");
                Err(self.at(value, fallback, path, &message))
            }
        }
    }
}
