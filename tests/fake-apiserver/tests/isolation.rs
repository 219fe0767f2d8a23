//! The isolation checker catches a pod that runs without a default-deny ingress policy (and a
//! policy deleted under a running pod), NetworkPolicies select by matchLabels and
//! matchExpressions, and the garbage collector deletes a policy owned by a pod once the pod is
//! gone, never while it runs.
#![allow(clippy::unwrap_used)]

mod common;

use common::{Server, eventually, job};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy};
use serde_json::{Value, json};

/// A default-deny ingress policy with `selector` as its pod selector.
fn deny(name: &str, selector: Value) -> NetworkPolicy {
    serde_json::from_value(json!({"metadata": {"name": name},
        "spec": {"podSelector": selector, "policyTypes": ["Ingress"]}}))
    .unwrap()
}

/// The name of the running pod of the Job whose template has `step=<step>`.
async fn running_pod(pods: &Api<Pod>, step: &str) -> Pod {
    eventually(30, &format!("the pod of {step} running"), || async {
        let list = pods.list(&ListParams::default().labels(&format!("step={step}"))).await.unwrap();
        list.items.into_iter().find(|pod| pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
    })
    .await
}

async fn violations(server: &Server) -> Vec<Value> {
    server.fake("GET", "violations", Value::Null).await["violations"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn a_pod_running_without_a_default_deny_policy_is_a_violation() {
    let server = Server::start(&["--grace", "1s"]).await;
    server.namespace("iso").await;
    let policies: Api<NetworkPolicy> = Api::namespaced(server.client.clone(), "iso");
    let pods: Api<Pod> = Api::namespaced(server.client.clone(), "iso");
    let by_expression = json!({"matchExpressions": [{"key": "step", "operator": "In", "values": ["guarded"]}]});
    policies.create(&PostParams::default(), &deny("deny-guarded", by_expression)).await.unwrap();
    server.create_job("iso", job("guarded", "sleep 1000000", json!({}))).await;
    server.create_job("iso", job("bare", "sleep 1000000", json!({}))).await;
    let guarded = running_pod(&pods, "guarded").await.metadata.name.unwrap();
    let bare = running_pod(&pods, "bare").await.metadata.name.unwrap();

    // Only the pod no policy selects, seen as its container started.
    let found = violations(&server).await;
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0]["pod"], bare.as_str());
    let missing = found[0]["missing"].as_str().unwrap();
    assert!(
        missing.starts_with("no NetworkPolicy with policyTypes [Ingress] in namespace iso selects it"),
        "{missing}"
    );
    assert_eq!(found[0]["during"], format!("container run of pod {bare} starting"));

    // A policy by matchLabels ends that episode; deleting the guarded pod's policy starts one.
    policies
        .create(&PostParams::default(), &deny("deny-bare", json!({"matchLabels": {"step": "bare"}})))
        .await
        .unwrap();
    policies.delete("deny-guarded", &DeleteParams::default()).await.unwrap();
    let found = violations(&server).await;
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(found[0]["ended_ms"].is_u64(), "{found:#?}");
    assert_eq!(
        (found[1]["pod"].as_str(), found[1]["during"].as_str()),
        (Some(guarded.as_str()), Some("delete of networkpolicies/deny-guarded"))
    );

    // A policy that allows some ingress does not deny all of it.
    let open: NetworkPolicy = serde_json::from_value(json!({"metadata": {"name": "open"},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{"from": [{"podSelector": {}}]}]}}))
    .unwrap();
    policies.create(&PostParams::default(), &open).await.unwrap();
    let found = violations(&server).await;
    assert!(
        found
            .iter()
            .any(|v| v["pod"] == bare.as_str() && v["missing"] == "the NetworkPolicy open selecting it allows ingress"),
        "{found:#?}"
    );

    // Selectors the API server refuses.
    let refused = policies
        .create(&PostParams::default(), &deny("bad", json!({"matchExpressions": [{"key": "step", "operator": "In"}]})))
        .await
        .unwrap_err();
    let kube::Error::Api(status) = refused else { panic!("{refused:?}") };
    assert_eq!(status.code, 422);
    assert!(
        status.message.contains("spec.podSelector.matchExpressions[0].values: Required value"),
        "{}",
        status.message
    );
}

#[tokio::test]
async fn a_policy_owned_by_a_pod_outlives_it_and_goes_after_it() {
    let server = Server::start(&["--grace", "2s"]).await;
    server.namespace("gc").await;
    let policies: Api<NetworkPolicy> = Api::namespaced(server.client.clone(), "gc");
    let pods: Api<Pod> = Api::namespaced(server.client.clone(), "gc");
    policies
        .create(&PostParams::default(), &deny("deny-owned", json!({"matchLabels": {"step": "owned"}})))
        .await
        .unwrap();
    // The pod ignores TERM: it terminates only at the end of its grace period.
    let mut slow = job("owned", "trap '' TERM; sleep 1000000", json!({}));
    slow["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = json!(3);
    server.create_job("gc", slow).await;
    let pod = running_pod(&pods, "owned").await;
    let (name, uid) = (pod.metadata.name.clone().unwrap(), pod.metadata.uid.clone().unwrap());

    // An owner reference without a uid is refused, as upstream's ValidateOwnerReferences does.
    let incomplete = json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name}]}});
    let refused = policies.patch("deny-owned", &PatchParams::default(), &Patch::Merge(&incomplete)).await.unwrap_err();
    let kube::Error::Api(status) = refused else { panic!("{refused:?}") };
    assert_eq!(status.code, 422);
    assert!(
        status.message.contains("metadata.ownerReferences.uid: Invalid value: \"\": must not be empty"),
        "{}",
        status.message
    );

    let owned =
        json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}]}});
    policies.patch("deny-owned", &PatchParams::default(), &Patch::Merge(&owned)).await.unwrap();
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(server.client.clone(), "gc");
    let background = DeleteParams { propagation_policy: Some(PropagationPolicy::Background), ..Default::default() };
    jobs.delete("owned", &background).await.unwrap();
    // The pod terminates for its grace period; its policy stays all along, then goes.
    let terminating = eventually(10, "the pod terminating", || async {
        pods.get_opt(&name).await.unwrap().filter(|pod| pod.metadata.deletion_timestamp.is_some())
    })
    .await;
    assert!(terminating.status.unwrap().container_statuses.unwrap()[0].state.as_ref().unwrap().running.is_some());
    assert!(policies.get_opt("deny-owned").await.unwrap().is_some(), "the policy went before its pod");
    eventually(30, "the pod gone", || async { pods.get_opt(&name).await.unwrap().is_none().then_some(()) }).await;
    eventually(10, "the policy gone", || async {
        policies.get_opt("deny-owned").await.unwrap().is_none().then_some(())
    })
    .await;
    let found = violations(&server).await;
    assert!(found.is_empty(), "the pod ran unprotected: {found:#?}");
    let report = server.fake("GET", "violations", Value::Null).await;
    assert!(report["protected_seen"].as_u64().unwrap() > 0, "the checker never saw the pod run: {report:#}");
}
