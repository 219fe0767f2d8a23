//! NetworkPolicies: the validation of their spec, and which pods they isolate.
//!
//! Validation is pkg/apis/networking/validation/validation.go (`ValidateNetworkPolicySpec`: the
//! `podSelector` and every peer's selectors through
//! staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/validation/validation.go
//! `ValidateLabelSelector` and `ValidateLabelSelectorRequirement`; at most two `policyTypes`,
//! each `Ingress` or `Egress`). The defaulting of `policyTypes` is the registry's
//! (`registry.rs`).
//!
//! Isolation is what staging/src/k8s.io/api/networking/v1/types.go says a network plugin
//! enforces: a policy applies to the pods of its own namespace that its `podSelector` selects
//! (an empty selector selects them all; the selector's semantics are
//! staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/helpers.go `LabelSelectorAsSelector`,
//! `selectors.rs`); a pod selected by no policy whose `policyTypes` hold `Ingress` takes any
//! ingress; a selected pod takes only what matches an ingress rule of one of the policies that
//! select it, so it denies all ingress exactly when none of them has a rule.

use serde_json::{Value, json};

use crate::selectors::LabelSelector;
use crate::status::FieldError;
use crate::util::text;
use crate::validation;

/// `ValidateLabelSelector`: `matchLabels` as labels, each `matchExpressions` requirement.
fn label_selector(selector: Option<&Value>, path: &str, errors: &mut Vec<FieldError>) {
    let Some(selector) = selector.filter(|s| !s.is_null()) else { return };
    validation::labels(selector.get("matchLabels"), &format!("{path}.matchLabels"), errors);
    for (i, requirement) in selector.get("matchExpressions").and_then(Value::as_array).into_iter().flatten().enumerate()
    {
        let at = format!("{path}.matchExpressions[{i}]");
        let values = requirement.get("values").and_then(Value::as_array).map_or(0, Vec::len);
        match text(requirement, "/operator") {
            "In" | "NotIn" if values == 0 => errors.push(FieldError::required(
                format!("{at}.values"),
                "must be specified when `operator` is 'In' or 'NotIn'",
            )),
            "Exists" | "DoesNotExist" if values > 0 => errors.push(FieldError::forbidden(
                format!("{at}.values"),
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            )),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => errors.push(FieldError::invalid(
                format!("{at}.operator"),
                &json!(other),
                "not a valid selector operator",
            )),
        }
        if let Some(error) = validation::qualified_name(text(requirement, "/key")) {
            errors.push(FieldError::invalid(format!("{at}.key"), &json!(text(requirement, "/key")), error));
        }
    }
}

/// `ValidateNetworkPolicySpec`: the selectors and the policy types (ports and IP blocks are
/// not checked).
pub fn validate_spec(policy: &Value, errors: &mut Vec<FieldError>) {
    let spec = policy.get("spec").unwrap_or(&Value::Null);
    label_selector(spec.get("podSelector"), "spec.podSelector", errors);
    for (direction, peers) in [("ingress", "from"), ("egress", "to")] {
        for (i, rule) in spec.get(direction).and_then(Value::as_array).into_iter().flatten().enumerate() {
            for (j, peer) in rule.get(peers).and_then(Value::as_array).into_iter().flatten().enumerate() {
                let at = format!("spec.{direction}[{i}].{peers}[{j}]");
                label_selector(peer.get("podSelector"), &format!("{at}.podSelector"), errors);
                label_selector(peer.get("namespaceSelector"), &format!("{at}.namespaceSelector"), errors);
                if ["podSelector", "namespaceSelector", "ipBlock"].iter().all(|key| peer.get(key).is_none()) {
                    errors.push(FieldError::required(at, "must specify a peer"));
                }
            }
        }
    }
    let types = spec.get("policyTypes").and_then(Value::as_array).cloned().unwrap_or_default();
    if types.len() > 2 {
        errors.push(FieldError::invalid(
            "spec.policyTypes",
            &json!(types),
            "may not specify more than two policyTypes",
        ));
        return;
    }
    for (i, kind) in types.iter().enumerate() {
        if kind != "Ingress" && kind != "Egress" {
            errors.push(FieldError::not_supported(format!("spec.policyTypes[{i}]"), kind, &["Ingress", "Egress"]));
        }
    }
}

/// Whether `policy` applies to `pod` for ingress: the same namespace, `Ingress` among its
/// policy types, and its pod selector selects the pod's labels.
fn isolates_ingress(policy: &Value, pod: &Value) -> bool {
    text(policy, "/metadata/namespace") == text(pod, "/metadata/namespace")
        && policy
            .pointer("/spec/policyTypes")
            .and_then(Value::as_array)
            .is_some_and(|types| types.iter().any(|kind| kind == "Ingress"))
        && LabelSelector::from_object(policy.pointer("/spec/podSelector").unwrap_or(&json!({})))
            .matches(pod.pointer("/metadata/labels"))
}

/// Whether `pod` denies all ingress under `policies` (every policy of the cluster): `Ok`, or
/// what is missing.
pub fn denies_all_ingress<'a>(pod: &Value, policies: impl IntoIterator<Item = &'a Value>) -> Result<(), String> {
    let selecting: Vec<&Value> = policies.into_iter().filter(|policy| isolates_ingress(policy, pod)).collect();
    if selecting.is_empty() {
        return Err(format!(
            "no NetworkPolicy with policyTypes [Ingress] in namespace {} selects it",
            text(pod, "/metadata/namespace")
        ));
    }
    let allowing: Vec<&str> = selecting
        .iter()
        .filter(|policy| {
            policy.pointer("/spec/ingress").and_then(Value::as_array).is_some_and(|rules| !rules.is_empty())
        })
        .map(|policy| text(policy, "/metadata/name"))
        .collect();
    if !allowing.is_empty() {
        return Err(format!("the NetworkPolicy {} selecting it allows ingress", allowing.join(", ")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(labels: Value) -> Value {
        json!({"metadata": {"name": "p", "namespace": "runs", "labels": labels}})
    }

    fn policy(name: &str, namespace: &str, selector: Value, ingress: Option<Value>) -> Value {
        let mut policy = json!({"metadata": {"name": name, "namespace": namespace},
            "spec": {"podSelector": selector, "policyTypes": ["Ingress"]}});
        if let Some(ingress) = ingress {
            policy["spec"]["ingress"] = ingress;
        }
        policy
    }

    #[test]
    fn a_pod_denies_all_ingress_only_under_a_selecting_policy_without_rules() {
        let run = pod(json!({"runner": "r", "run": "a"}));
        let check = |policies: &[Value]| denies_all_ingress(&run, policies.iter());
        let by_labels = policy("deny", "runs", json!({"matchLabels": {"run": "a"}}), None);
        let by_expression = policy(
            "deny",
            "runs",
            json!({"matchExpressions": [{"key": "run", "operator": "In", "values": ["a", "b"]}]}),
            Some(json!([])),
        );
        let everything = policy("deny", "runs", json!({}), None);
        assert_eq!(check(std::slice::from_ref(&by_labels)), Ok(()));
        assert_eq!(check(std::slice::from_ref(&by_expression)), Ok(()));
        assert_eq!(check(std::slice::from_ref(&everything)), Ok(()));
        for missing in [
            vec![],
            vec![policy("deny", "runs", json!({"matchLabels": {"run": "b"}}), None)],
            vec![policy("deny", "other", json!({"matchLabels": {"run": "a"}}), None)],
            vec![policy(
                "deny",
                "runs",
                json!({"matchExpressions": [{"key": "run", "operator": "DoesNotExist"}]}),
                None,
            )],
            vec![{
                let mut egress = by_labels.clone();
                egress["spec"]["policyTypes"] = json!(["Egress"]);
                egress
            }],
        ] {
            let error = check(&missing).expect_err("not isolated");
            assert!(error.starts_with("no NetworkPolicy"), "{error}");
        }
        let allowing = policy("open", "runs", json!({"matchLabels": {"runner": "r"}}), Some(json!([{}])));
        assert_eq!(
            check(&[by_labels, allowing]),
            Err("the NetworkPolicy open selecting it allows ingress".to_string())
        );
    }

    #[test]
    fn selectors_and_policy_types_are_validated() {
        let mut errors = Vec::new();
        validate_spec(
            &json!({"spec": {"podSelector": {"matchExpressions": [
                {"key": "a", "operator": "In"},
                {"key": "b", "operator": "Exists", "values": ["x"]},
                {"key": "bad key", "operator": "Near", "values": ["x"]}]},
                "ingress": [{"from": [{}]}], "policyTypes": ["Ingress", "Sideways"]}}),
            &mut errors,
        );
        let fields: Vec<String> = errors.iter().map(|error| error.field.clone()).collect();
        assert_eq!(
            fields,
            [
                "spec.podSelector.matchExpressions[0].values",
                "spec.podSelector.matchExpressions[1].values",
                "spec.podSelector.matchExpressions[2].operator",
                "spec.podSelector.matchExpressions[2].key",
                "spec.ingress[0].from[0]",
                "spec.policyTypes[1]",
            ]
        );
    }
}
