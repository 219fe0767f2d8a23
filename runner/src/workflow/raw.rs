//! The workflow file as serde reads it, spans kept; `check.rs` converts it into the model.

mod check;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::{Location, Spanned};

use super::locate::{PathIndex, Position, yaml_error};
use super::{QueuePhase, Workflow, WorkflowError};
use check::{Check, at_position};
use knotless_protocol::duration::{DURATION_HINT, parse_duration};

/// Parser options: one document, duplicate keys refused, and a budget far below the defaults
/// (a workflow is a few hundred nodes) so an alias bomb fails fast.
fn options() -> serde_saphyr::Options {
    let mut alias_limits = serde_saphyr::options::AliasLimits::default();
    alias_limits.max_total_replayed_events = 50_000;
    alias_limits.max_replay_stack_depth = 16;
    alias_limits.max_alias_expansions_per_anchor = 1_000;
    serde_saphyr::options! {
        with_snippet: false,
        budget: serde_saphyr::budget! {
            max_events: 100_000,
            max_aliases: 1_000,
            max_anchors: 1_000,
            max_nodes: 50_000,
            max_depth: 32,
            max_total_scalar_bytes: 4 * 1024 * 1024,
            max_recorded_anchor_events: 50_000,
            max_recorded_anchor_bytes: 1024 * 1024,
        },
        alias_limits: alias_limits,
    }
}

/// Reads and checks a workflow (see [`super::parse`]).
pub(crate) fn parse(name: &str, file: &str, text: &str) -> Result<Workflow, WorkflowError> {
    match serde_saphyr::from_str_with_options::<Spanned<Option<TopLevel>>>(text, options()) {
        Ok(raw) => {
            let start = Position { line: 1, column: 1 };
            let Some(TopLevel(workflow)) = raw.value else {
                return Err(at_position(file, start, "", "the file is empty, expected a mapping with steps"));
            };
            let root = Position::of(raw.referenced).unwrap_or(start);
            Check { file, text }.workflow(name, root, workflow)
        }
        Err(error) => {
            // The index reads past duplicate keys so that their error can name the field too.
            let mut index_options = options();
            index_options.duplicate_keys = serde_saphyr::DuplicateKeyPolicy::LastWins;
            let index = PathIndex::build(text, index_options);
            Err(yaml_error(file, &error, index.as_ref()))
        }
    }
}

/// The top level of a workflow file: the fields of [`WorkflowRaw`], and extension keys, which
/// start with `x-` and are skipped (as in docker compose: a place for YAML anchors).
#[derive(Debug)]
struct TopLevel(WorkflowRaw);

/// The prefix of the top-level keys a workflow file may hold for its own use.
const EXTENSION_PREFIX: &str = "x-";

impl<'de> Deserialize<'de> for TopLevel {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TopLevelVisitor;
        impl<'de> Visitor<'de> for TopLevelVisitor {
            type Value = TopLevel;
            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("a mapping with steps")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<TopLevel, A::Error> {
                // The derived reader, refusing unknown fields, sees every key but the extensions.
                let fields = de::value::MapAccessDeserializer::new(SkipExtensions(map));
                WorkflowRaw::deserialize(fields).map(TopLevel)
            }
        }
        deserializer.deserialize_map(TopLevelVisitor)
    }
}

/// A mapping without its `x-` keys and their values.
struct SkipExtensions<A>(A);

impl<'de, A: MapAccess<'de>> MapAccess<'de> for SkipExtensions<A> {
    type Error = A::Error;

    fn next_key_seed<K: de::DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        while let Some(key) = self.0.next_key::<String>()? {
            if key.starts_with(EXTENSION_PREFIX) {
                self.0.next_value::<de::IgnoredAny>()?;
                continue;
            }
            return seed.deserialize(de::value::StringDeserializer::<A::Error>::new(key)).map(Some);
        }
        Ok(None)
    }

    fn next_value_seed<V: de::DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.0.next_value_seed(seed)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkflowRaw {
    on: Option<Spanned<OnRaw>>,
    image: Option<Spanned<String>>,
    resources: Option<ResourcesRaw>,
    timeout: Option<Spanned<DurationRaw>>,
    env: Option<EnvRaw>,
    cache: Option<Vec<Spanned<String>>>,
    runners: Option<Vec<Spanned<String>>>,
    queue: Option<QueuePhase>,
    network: Option<Spanned<StrictBool>>,
    #[serde(rename = "working-directory")]
    working_directory: Option<Spanned<String>>,
    matrix: Option<Spanned<MatrixRaw>>,
    needs: Option<Vec<Spanned<String>>>,
    #[serde(rename = "if")]
    condition: Option<Spanned<String>>,
    services: Option<Spanned<BTreeMap<String, Spanned<ServiceRaw>>>>,
    steps: Option<Spanned<Vec<Spanned<StepRaw>>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceRaw {
    image: Option<Spanned<String>>,
    command: Option<Vec<Spanned<String>>>,
    env: Option<EnvRaw>,
    health: Option<Spanned<String>>,
    #[serde(rename = "health-timeout")]
    health_timeout: Option<Spanned<DurationRaw>>,
}

/// `matrix:` as written: variables with their lists of values, in the order written, and the
/// combinations to add (`include`) and to take out (`exclude`).
#[derive(Debug, Default)]
struct MatrixRaw {
    variables: Vec<(Spanned<String>, Vec<Spanned<String>>)>,
    include: Vec<EnvRaw>,
    exclude: Vec<EnvRaw>,
    max_parallel: Option<Spanned<i64>>,
}

impl<'de> Deserialize<'de> for MatrixRaw {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MatrixVisitor;
        impl<'de> Visitor<'de> for MatrixVisitor {
            type Value = MatrixRaw;
            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str(
                    "a mapping of variable names to lists of values, with `include`, `exclude` and `max-parallel`",
                )
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<MatrixRaw, A::Error> {
                let mut matrix = MatrixRaw::default();
                while let Some(name) = map.next_key::<Spanned<String>>()? {
                    match name.value.as_str() {
                        "include" => matrix.include = map.next_value()?,
                        "exclude" => matrix.exclude = map.next_value()?,
                        "max-parallel" => matrix.max_parallel = Some(map.next_value()?),
                        _ => {
                            let values = map.next_value()?;
                            matrix.variables.push((name, values));
                        }
                    }
                }
                Ok(matrix)
            }
        }
        deserializer.deserialize_map(MatrixVisitor)
    }
}

/// The most combinations one matrix makes.
const MAX_COMBINATIONS: usize = 64;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StepRaw {
    name: Spanned<String>,
    run: Option<Spanned<String>>,
    uses: Option<Spanned<String>>,
    timeout: Option<Spanned<DurationRaw>>,
    secrets: Option<Vec<Spanned<String>>>,
    env: Option<EnvRaw>,
    #[serde(rename = "continue-on-error")]
    continue_on_error: Option<Spanned<StrictBool>>,
    #[serde(rename = "working-directory")]
    working_directory: Option<Spanned<String>>,
    shell: Option<Spanned<String>>,
    #[serde(rename = "if")]
    condition: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResourcesRaw {
    cpu: Option<Spanned<String>>,
    memory: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct BranchFilterRaw {
    branches: Option<Vec<Spanned<String>>>,
    paths: Option<Vec<Spanned<String>>>,
    inputs: Option<EnvRaw>,
}

/// `on:` as written: a single event name, a list of them, or a mapping of event to filter.
#[derive(Debug)]
struct OnRaw(Vec<(Spanned<String>, Option<BranchFilterRaw>)>);

impl<'de> Deserialize<'de> for OnRaw {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(OnVisitor)
    }
}

struct OnVisitor;

impl<'de> Visitor<'de> for OnVisitor {
    type Value = OnRaw;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("an event name, a list of event names, or a mapping of event names to branch filters")
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<OnRaw, E> {
        // The location of a lone scalar is the whole `on:` value's; the checker fills it in.
        let name = Spanned::new(value.to_string(), Location::UNKNOWN, Location::UNKNOWN);
        Ok(OnRaw(vec![(name, None)]))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<OnRaw, A::Error> {
        let mut events = Vec::new();
        while let Some(name) = seq.next_element::<Spanned<String>>()? {
            events.push((name, None));
        }
        Ok(OnRaw(events))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<OnRaw, A::Error> {
        let mut events = Vec::new();
        while let Some(name) = map.next_key::<Spanned<String>>()? {
            let filter = map.next_value::<Option<BranchFilterRaw>>()?;
            events.push((name, Some(filter.unwrap_or_default())));
        }
        Ok(OnRaw(events))
    }
}

/// A mapping of variable names to text values (strings, numbers and booleans as written).
#[derive(Debug, Clone)]
struct EnvRaw(Vec<(Spanned<String>, Spanned<String>)>);

impl<'de> Deserialize<'de> for EnvRaw {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(EnvVisitor)
    }
}

struct EnvVisitor;

impl<'de> Visitor<'de> for EnvVisitor {
    type Value = EnvRaw;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a mapping of variable names to values")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<EnvRaw, A::Error> {
        let mut pairs = Vec::new();
        while let Some(name) = map.next_key::<Spanned<String>>()? {
            pairs.push((name, map.next_value::<Spanned<String>>()?));
        }
        Ok(EnvRaw(pairs))
    }
}

/// A duration as written (`90s`, `10m`, `1h30m`, `500ms`).
#[derive(Debug)]
struct DurationRaw(Duration);

impl<'de> Deserialize<'de> for DurationRaw {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(DurationVisitor)
    }
}

struct DurationVisitor;

impl DurationVisitor {
    fn invalid<E: de::Error>(text: impl fmt::Display) -> E {
        E::custom(format_args!("invalid duration {text}, {DURATION_HINT}"))
    }
}

impl Visitor<'_> for DurationVisitor {
    type Value = DurationRaw;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        write!(formatter, "a duration, {DURATION_HINT}")
    }
    fn visit_str<E: de::Error>(self, value: &str) -> Result<DurationRaw, E> {
        parse_duration(value).map(DurationRaw).ok_or_else(|| Self::invalid(format_args!("{value:?}")))
    }
    fn visit_i64<E: de::Error>(self, value: i64) -> Result<DurationRaw, E> {
        Err(Self::invalid(value))
    }
    fn visit_u64<E: de::Error>(self, value: u64) -> Result<DurationRaw, E> {
        Err(Self::invalid(value))
    }
    fn visit_f64<E: de::Error>(self, value: f64) -> Result<DurationRaw, E> {
        Err(Self::invalid(value))
    }
}

/// A boolean as written: YAML's `true` or `false`, or anything else (a quoted `"true"`, `yes`,
/// `on`, `1`), which the checks refuse naming the field, never reading it as a boolean.
#[derive(Debug, Clone)]
enum StrictBool {
    Bool(bool),
    Other(String),
}

impl<'de> Deserialize<'de> for StrictBool {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct StrictBoolVisitor;
        impl<'de> Visitor<'de> for StrictBoolVisitor {
            type Value = StrictBool;
            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("`true` or `false`")
            }
            fn visit_bool<E: de::Error>(self, value: bool) -> Result<StrictBool, E> {
                Ok(StrictBool::Bool(value))
            }
            fn visit_str<E: de::Error>(self, value: &str) -> Result<StrictBool, E> {
                Ok(StrictBool::Other(format!("the string {value:?}")))
            }
            fn visit_i64<E: de::Error>(self, value: i64) -> Result<StrictBool, E> {
                Ok(StrictBool::Other(format!("the number {value}")))
            }
            fn visit_u64<E: de::Error>(self, value: u64) -> Result<StrictBool, E> {
                Ok(StrictBool::Other(format!("the number {value}")))
            }
            fn visit_f64<E: de::Error>(self, value: f64) -> Result<StrictBool, E> {
                Ok(StrictBool::Other(format!("the number {value}")))
            }
            fn visit_unit<E: de::Error>(self) -> Result<StrictBool, E> {
                Ok(StrictBool::Other("an empty value".to_string()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StrictBool, A::Error> {
                while seq.next_element::<de::IgnoredAny>()?.is_some() {}
                Ok(StrictBool::Other("a list".to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<StrictBool, A::Error> {
                while map.next_entry::<de::IgnoredAny, de::IgnoredAny>()?.is_some() {}
                Ok(StrictBool::Other("a mapping".to_string()))
            }
        }
        deserializer.deserialize_any(StrictBoolVisitor)
    }
}
