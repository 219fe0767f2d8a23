//! Where things are in a workflow file: serde-saphyr errors and spans turned into `file:line:column: field: message`.
//!
//! serde reports no field path, so the file is also read into a tree of spanned nodes,
//! and an error's line and column are looked up in it to name the field (`steps[1].timeout`).

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::{Location, Spanned};

use super::WorkflowError;

/// A line and column in a workflow file, both from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Position {
    pub(crate) line: u64,
    pub(crate) column: u64,
}

impl Position {
    /// The position of a serde-saphyr location, `None` when it is unknown (line 0).
    pub(crate) fn of(location: Location) -> Option<Position> {
        (location != Location::UNKNOWN && location.line() > 0)
            .then(|| Position { line: location.line(), column: location.column() })
    }
}

/// Every node and mapping key of a document, with its position and its field path.
#[derive(Debug, Default)]
pub(crate) struct PathIndex {
    /// (position, path), in document order; a key and its value share the value's path.
    entries: Vec<(Position, String)>,
}

impl PathIndex {
    /// Reads the document's node tree; `None` when it is not valid YAML (the typed parse says why).
    pub(crate) fn build(text: &str, options: serde_saphyr::Options) -> Option<PathIndex> {
        let root: Spanned<Node> = serde_saphyr::from_str_with_options(text, options).ok()?;
        let mut index = PathIndex::default();
        index.walk(&root, String::new());
        Some(index)
    }

    fn walk(&mut self, node: &Spanned<Node>, path: String) {
        if let Some(position) = Position::of(node.referenced) {
            self.entries.push((position, path.clone()));
        }
        match &node.value {
            Node::Scalar => {}
            Node::Sequence(items) => {
                for (index, item) in items.iter().enumerate() {
                    self.walk(item, format!("{path}[{index}]"));
                }
            }
            Node::Mapping(pairs) => {
                for (key, value) in pairs {
                    let child = if path.is_empty() { key.value.0.clone() } else { format!("{path}.{}", key.value.0) };
                    if let Some(position) = Position::of(key.referenced) {
                        self.entries.push((position, child.clone()));
                    }
                    self.walk(value, child);
                }
            }
        }
    }

    /// The field at `position`: the deepest (or, with `outermost`, the shallowest) path
    /// starting exactly there, else the last one starting before it.
    pub(crate) fn path_at(&self, position: Position, outermost: bool) -> Option<&str> {
        let exact = self.entries.iter().filter(|(at, _)| *at == position);
        let best =
            if outermost { exact.min_by_key(|(_, path)| path.len()) } else { exact.max_by_key(|(_, path)| path.len()) };
        best.or_else(|| self.entries.iter().filter(|(at, _)| *at < position).max_by_key(|(at, path)| (*at, path.len())))
            .map(|(_, path)| path.as_str())
            .filter(|path| !path.is_empty())
    }
}

/// A YAML node with only its shape kept: enough to name paths.
#[derive(Debug)]
enum Node {
    Scalar,
    Sequence(Vec<Spanned<Node>>),
    Mapping(Vec<(Spanned<KeyText>, Spanned<Node>)>),
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("any YAML node")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_i128<E: de::Error>(self, _: i128) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_u128<E: de::Error>(self, _: u128) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_none<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Node, D::Error> {
        Node::deserialize(deserializer)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Node::Sequence(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut pairs = Vec::new();
        while let Some(key) = map.next_key()? {
            pairs.push((key, map.next_value()?));
        }
        Ok(Node::Mapping(pairs))
    }
}

/// A mapping key as text (`"?"` for a key that is itself a collection).
#[derive(Debug)]
struct KeyText(String);

impl<'de> Deserialize<'de> for KeyText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Asked for a string, serde-saphyr gives any scalar's text as written (`on`, not `true`).
        let text = String::deserialize(deserializer).unwrap_or_else(|_| "?".to_string());
        Ok(KeyText(text))
    }
}

/// The message of a serde-saphyr error, without its location suffix or snippet.
pub(crate) fn bare_message(error: &serde_saphyr::Error) -> String {
    use serde_saphyr::MessageFormatter;
    let mut inner = error;
    while let serde_saphyr::Error::AliasError { error, .. } | serde_saphyr::Error::WithSnippet { error, .. } = inner {
        inner = error;
    }
    let text = serde_saphyr::UserMessageFormatter.format_message(inner);
    text.chars().map(|c| if c.is_control() { c.escape_debug().to_string() } else { c.to_string() }).collect()
}

/// A workflow error from a serde-saphyr error, naming the field when the index knows it.
pub(crate) fn yaml_error(file: &str, error: &serde_saphyr::Error, index: Option<&PathIndex>) -> WorkflowError {
    let position = error.location().and_then(Position::of);
    let message = bare_message(error);
    let outermost = message.starts_with("missing field");
    let path = match (index, position) {
        (Some(index), Some(position)) => index.path_at(position, outermost),
        _ => None,
    };
    WorkflowError {
        file: file.to_string(),
        line: position.map(|p| p.line),
        column: position.map(|p| p.column),
        message: match path {
            Some(path) => format!("{path}: {message}"),
            None => message,
        },
    }
}
