//! Label and field selectors: the grammar of staging/src/k8s.io/apimachinery/pkg/labels/selector.go
//! (`=`, `==`, `!=`, `in`, `notin`, exists, `!`), the field selectors of
//! staging/src/k8s.io/apimachinery/pkg/fields/selector.go and the selectable fields of each
//! registry's `GetAttrs`/`ToSelectableFields` (pkg/registry/core/pod/strategy.go,
//! pkg/registry/core/event/strategy.go, pkg/registry/batch/job/strategy.go, ...).

use serde_json::Value;

use crate::status::ApiError;
use crate::util::text;

#[derive(Debug, Clone, PartialEq)]
enum Op {
    Eq(String),
    Ne(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    NotExists,
}

/// A parsed label selector (every requirement must hold).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<(String, Op)>);

/// Splits on commas outside parentheses.
fn split_top(text: &str) -> Vec<String> {
    let (mut parts, mut depth, mut current) = (Vec::new(), 0i32, String::new());
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    parts.push(current);
    parts
}

fn bad(detail: &str) -> ApiError {
    ApiError::bad_request(format!("unable to parse requirement: {detail}"))
}

fn set(values: &str, whole: &str) -> Result<Vec<String>, ApiError> {
    let inner = values
        .trim()
        .strip_prefix('(')
        .and_then(|v| v.strip_suffix(')'))
        .ok_or_else(|| bad(&format!("found '{whole}', expected: '('")))?;
    Ok(inner.split(',').map(|v| v.trim().to_string()).filter(|v| !v.is_empty()).collect())
}

impl LabelSelector {
    pub fn parse(text: &str) -> Result<Self, ApiError> {
        let mut requirements = Vec::new();
        if text.trim().is_empty() {
            return Ok(Self(requirements));
        }
        for part in split_top(text) {
            let part = part.trim();
            if part.is_empty() {
                return Err(bad("found '', expected: !, identifier, or 'end of string'"));
            }
            let requirement = if let Some(key) = part.strip_prefix('!') {
                (key.trim().to_string(), Op::NotExists)
            } else if let Some((key, value)) = part.split_once("!=") {
                (key.trim().to_string(), Op::Ne(value.trim().to_string()))
            } else if let Some((key, value)) = part.split_once("==") {
                (key.trim().to_string(), Op::Eq(value.trim().to_string()))
            } else if let Some((key, value)) = part.split_once('=') {
                (key.trim().to_string(), Op::Eq(value.trim().to_string()))
            } else if let Some(index) = part.find(" notin ").or_else(|| part.find(" notin(")) {
                (part[..index].trim().to_string(), Op::NotIn(set(&part[index + 6..], part)?))
            } else if let Some(index) = part.find(" in ").or_else(|| part.find(" in(")) {
                (part[..index].trim().to_string(), Op::In(set(&part[index + 3..], part)?))
            } else if part.contains(char::is_whitespace) || part.contains(['(', ')']) {
                return Err(bad(&format!("found '{part}', expected: in, notin, =, ==, !=, gt, lt")));
            } else {
                (part.to_string(), Op::Exists)
            };
            if crate::validation::qualified_name(&requirement.0).is_some() {
                return Err(bad(&format!("invalid label key \"{}\"", requirement.0)));
            }
            requirements.push(requirement);
        }
        Ok(Self(requirements))
    }

    /// Whether labels (a JSON object or null) match.
    pub fn matches(&self, labels: Option<&Value>) -> bool {
        self.0.iter().all(|(key, op)| {
            let value = labels.and_then(|l| l.get(key)).and_then(Value::as_str);
            match op {
                Op::Eq(v) => value == Some(v.as_str()),
                Op::Ne(v) => value != Some(v.as_str()),
                Op::In(vs) => value.is_some_and(|x| vs.iter().any(|v| v == x)),
                Op::NotIn(vs) => value.is_none_or(|x| !vs.iter().any(|v| v == x)),
                Op::Exists => value.is_some(),
                Op::NotExists => value.is_none(),
            }
        })
    }

    /// A `metav1.LabelSelector` (matchLabels and matchExpressions) as a selector.
    pub fn from_object(selector: &Value) -> Self {
        let mut requirements = Vec::new();
        if let Some(labels) = selector.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in labels {
                requirements.push((k.clone(), Op::Eq(v.as_str().unwrap_or("").to_string())));
            }
        }
        for expression in selector.get("matchExpressions").and_then(Value::as_array).into_iter().flatten() {
            let key = text(expression, "/key").to_string();
            let values: Vec<String> = expression
                .get("values")
                .and_then(Value::as_array)
                .map(|vs| vs.iter().filter_map(Value::as_str).map(str::to_string).collect())
                .unwrap_or_default();
            let op = match text(expression, "/operator") {
                "In" => Op::In(values),
                "NotIn" => Op::NotIn(values),
                "Exists" => Op::Exists,
                _ => Op::NotExists,
            };
            requirements.push((key, op));
        }
        Self(requirements)
    }
}

/// A parsed field selector.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

/// The selectable fields of a resource beyond `metadata.name` and `metadata.namespace`.
fn selectable(resource: &str) -> &'static [&'static str] {
    match resource {
        "pods" => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        "events" => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        "jobs" => &["status.successful"],
        "nodes" => &["spec.unschedulable"],
        "namespaces" => &["status.phase"],
        _ => &[],
    }
}

/// A field's value as the registry's field set renders it.
fn field(resource: &str, object: &Value, key: &str) -> String {
    match (resource, key) {
        ("events", "source") => text(object, "/source/component").to_string(),
        ("pods", "spec.hostNetwork") => {
            object.pointer("/spec/hostNetwork").and_then(Value::as_bool).unwrap_or(false).to_string()
        }
        ("jobs", "status.successful") => {
            object.pointer("/status/succeeded").and_then(Value::as_i64).unwrap_or(0).to_string()
        }
        ("nodes", "spec.unschedulable") => {
            object.pointer("/spec/unschedulable").and_then(Value::as_bool).unwrap_or(false).to_string()
        }
        _ => text(object, &format!("/{}", key.replace('.', "/"))).to_string(),
    }
}

impl FieldSelector {
    pub fn parse(resource: &str, text: &str) -> Result<Self, ApiError> {
        let mut terms = Vec::new();
        if text.trim().is_empty() {
            return Ok(Self(terms));
        }
        for part in text.split(',') {
            let (key, equal, value) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, true, v)
            } else {
                return Err(ApiError::bad_request(format!("invalid selector: '{text}'; can't understand '{part}'")));
            };
            let key = key.trim();
            if key != "metadata.name" && key != "metadata.namespace" && !selectable(resource).contains(&key) {
                return Err(ApiError::bad_request(format!("field label not supported: {key}")));
            }
            terms.push((key.to_string(), equal, value.trim().to_string()));
        }
        Ok(Self(terms))
    }

    pub fn matches(&self, resource: &str, object: &Value) -> bool {
        self.0.iter().all(|(key, equal, value)| (field(resource, object, key) == *value) == *equal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn labels() {
        let labels = json!({"a": "b", "c": "d"});
        for (selector, expected) in [
            ("a=b", true),
            ("a==b", true),
            ("a!=b", false),
            ("a in (x,b)", true),
            ("a notin (b)", false),
            ("a", true),
            ("!a", false),
            ("!z", true),
            ("a=b,c=d", true),
            ("a=b,c=e", false),
            ("z notin (x)", true),
        ] {
            assert_eq!(
                LabelSelector::parse(selector).map(|s| s.matches(Some(&labels))).ok(),
                Some(expected),
                "{selector}"
            );
        }
        assert!(LabelSelector::parse("a in b").is_err());
    }

    #[test]
    fn fields() {
        let event = json!({"involvedObject": {"name": "p", "kind": "Pod"}, "reason": "Pulled", "type": "Normal"});
        assert!(
            FieldSelector::parse("events", "involvedObject.name=p,reason=Pulled")
                .is_ok_and(|f| f.matches("events", &event))
        );
        assert!(FieldSelector::parse("events", "type!=Normal").is_ok_and(|f| !f.matches("events", &event)));
        assert!(FieldSelector::parse("jobs", "spec.foo=x").is_err());
    }
}
