//! The REST surface: errors, validation, authentication and authorization, discovery, watch
//! history, request accounting, through kube-rs.
#![allow(clippy::unwrap_used)]

mod common;

use common::{Server, eventually, http_request, job};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::authorization::v1::SelfSubjectAccessReview;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{ListParams, PostParams, WatchEvent, WatchParams};
use kube::{Api, Error};
use serde_json::{Value, json};

fn api_error(error: Error) -> kube::core::Status {
    match error {
        Error::Api(status) => *status,
        other => panic!("not an API error: {other:?}"),
    }
}

fn typed<T: serde::de::DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).unwrap()
}

#[tokio::test]
async fn errors_and_validation() {
    let server = Server::start(&[]).await;
    let jobs: Api<Job> = Api::namespaced(server.client.clone(), "default");
    let pp = PostParams::default();
    // NotFound and AlreadyExists.
    let status = api_error(jobs.get("nope").await.unwrap_err());
    assert_eq!(
        (status.code, status.reason.as_str(), status.message.as_str()),
        (404, "NotFound", "jobs.batch \"nope\" not found")
    );
    jobs.create(&pp, &typed(job("dup", "true", json!({})))).await.unwrap();
    let status = api_error(jobs.create(&pp, &typed(job("dup", "true", json!({})))).await.unwrap_err());
    assert_eq!(
        (status.code, status.reason.as_str(), status.message.as_str()),
        (409, "AlreadyExists", "jobs.batch \"dup\" already exists")
    );
    let details = status.details.unwrap();
    assert_eq!((details.name.as_str(), details.group.as_str(), details.kind.as_str()), ("dup", "batch", "jobs"));
    // A quantity that does not parse fails decoding (400), as the API server's decoder does.
    let mut bad = job("cores", "true", json!({}));
    bad["spec"]["template"]["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "2 cores"}});
    let request = http_request("POST", "/apis/batch/v1/namespaces/default/jobs", Some(bad), None);
    let status = api_error(server.client.request::<Value>(request).await.unwrap_err());
    assert_eq!(status.code, 400);
    assert_eq!(status.reason, "BadRequest");
    assert_eq!(
        status.message,
        "Job in version \"v1\" cannot be handled as a Job: quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    );
    // Value validation: 422 with causes.
    let mut invalid = job("invalid", "true", json!({"backoffLimit": -1}));
    invalid["spec"]["template"]["spec"]["restartPolicy"] = json!("Always");
    invalid["spec"]["template"]["spec"]["nodeSelector"] = json!({"bad key!": "x"});
    invalid["spec"]["template"]["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "-1"}});
    let status = api_error(jobs.create(&pp, &typed(invalid)).await.unwrap_err());
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    assert!(status.message.starts_with("Job.batch \"invalid\" is invalid: ["), "{}", status.message);
    assert!(
        status.message.contains("spec.backoffLimit: Invalid value: -1: must be greater than or equal to 0"),
        "{}",
        status.message
    );
    assert!(status.message.contains("spec.template.spec.restartPolicy: Unsupported value: \"Always\": supported values: \"OnFailure\", \"Never\""), "{}", status.message);
    assert!(status.message.contains("spec.template.spec.containers[0].resources.requests[cpu]: Invalid value: \"-1\": must be greater than or equal to 0"), "{}", status.message);
    let causes = status.details.unwrap().causes;
    let fields: Vec<(&str, &str)> = causes.iter().map(|c| (c.reason.as_str(), c.field.as_str())).collect();
    assert!(fields.contains(&("FieldValueInvalid", "spec.backoffLimit")), "{fields:?}");
    assert!(fields.contains(&("FieldValueNotSupported", "spec.template.spec.restartPolicy")), "{fields:?}");
    assert!(fields.contains(&("FieldValueInvalid", "spec.template.spec.nodeSelector")), "{fields:?}");
    let mut unnamed = job("", "true", json!({}));
    unnamed["spec"]["template"]["spec"]["containers"][0]["image"] = json!(" busybox");
    let status = api_error(jobs.create(&pp, &typed(unnamed)).await.unwrap_err());
    assert!(
        status.message.contains("metadata.name: Required value: name or generateName is required"),
        "{}",
        status.message
    );
    assert!(status.message.contains("spec.template.spec.containers[0].image: Invalid value: \" busybox\": must not have leading or trailing whitespace"), "{}", status.message);
    // Strict field validation: unknown fields are a 400; Warn answers with a Warning header.
    let mut unknown = job("unknown", "true", json!({"foo": 1}));
    unknown["spec"]["template"]["spec"]["containers"][0]["bar"] = json!(true);
    let request = http_request(
        "POST",
        "/apis/batch/v1/namespaces/default/jobs?fieldValidation=Strict",
        Some(unknown.clone()),
        None,
    );
    let status = api_error(server.client.request::<Value>(request).await.unwrap_err());
    assert_eq!((status.code, status.reason.as_str()), (400, "BadRequest"));
    assert_eq!(
        status.message,
        "strict decoding error: unknown field \"spec.foo\", unknown field \"spec.template.spec.containers[0].bar\""
    );
    let request = http_request("POST", "/apis/batch/v1/namespaces/default/jobs", Some(unknown), None);
    let response = server.client.send(request.map(Into::into)).await.unwrap();
    assert_eq!(response.status(), 201);
    let warnings: Vec<String> =
        response.headers().get_all("warning").iter().map(|v| v.to_str().unwrap().to_string()).collect();
    assert!(warnings.contains(&"299 - \"unknown field \\\"spec.foo\\\"\"".to_string()), "{warnings:?}");
    // Names: a namespace must be a DNS label.
    let namespaces: Api<Namespace> = Api::all(server.client.clone());
    let status = api_error(namespaces.create(&pp, &typed(json!({"metadata": {"name": "a.b"}}))).await.unwrap_err());
    assert!(status.message.starts_with("Namespace \"a.b\" is invalid: metadata.name: Invalid value: \"a.b\": a lowercase RFC 1123 label must consist of"), "{}", status.message);
    // Creating in a namespace that does not exist.
    let elsewhere: Api<Job> = Api::namespaced(server.client.clone(), "ghost");
    let status = api_error(elsewhere.create(&pp, &typed(job("x", "true", json!({})))).await.unwrap_err());
    assert_eq!((status.code, status.message.as_str()), (404, "namespaces \"ghost\" not found"));
}

#[tokio::test]
async fn tokens_rbac_and_faults() {
    let server = Server::start(&[]).await;
    server.namespace("scoped").await;
    let pp = PostParams::default();
    // 401 once a token expires.
    server.fake("POST", "tokens", json!({"token": "short-lived", "expires_in_s": 1})).await;
    let short = server.client_with_token("short-lived").await;
    let namespaces: Api<Namespace> = Api::all(short.clone());
    namespaces.list(&ListParams::default()).await.unwrap();
    let status =
        eventually(10, "expiry", || async { namespaces.list(&ListParams::default()).await.err().map(api_error) }).await;
    assert_eq!((status.code, status.reason.as_str(), status.message.as_str()), (401, "Unauthorized", "Unauthorized"));
    server.fake("POST", "tokens", json!({"token": "revoked"})).await;
    server.fake("POST", "tokens/revoke", json!({"token": "revoked"})).await;
    let revoked: Api<Namespace> = Api::all(server.client_with_token("revoked").await);
    assert_eq!(api_error(revoked.list(&ListParams::default()).await.unwrap_err()).code, 401);

    // A service account token scoped by a Role.
    let sas: Api<ServiceAccount> = Api::namespaced(server.client.clone(), "scoped");
    sas.create(&pp, &typed(json!({"metadata": {"name": "runner"}}))).await.unwrap();
    let roles: Api<Role> = Api::namespaced(server.client.clone(), "scoped");
    roles
        .create(
            &pp,
            &typed(json!({"metadata": {"name": "read-pods"}, "rules": [
        {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list", "watch"]}]})),
        )
        .await
        .unwrap();
    let bindings: Api<RoleBinding> = Api::namespaced(server.client.clone(), "scoped");
    bindings
        .create(
            &pp,
            &typed(json!({"metadata": {"name": "runner-reads"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-pods"},
        "subjects": [{"kind": "ServiceAccount", "name": "runner", "namespace": "scoped"}]})),
        )
        .await
        .unwrap();
    let request = http_request(
        "POST",
        "/api/v1/namespaces/scoped/serviceaccounts/runner/token",
        Some(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}})),
        None,
    );
    let answer: Value = server.client.request(request).await.unwrap();
    assert!(answer["status"]["expirationTimestamp"].is_string());
    let token = answer["status"]["token"].as_str().unwrap().to_string();
    let scoped = server.client_with_token(&token).await;
    let pods: Api<Pod> = Api::namespaced(scoped.clone(), "scoped");
    pods.list(&ListParams::default()).await.unwrap();
    let jobs: Api<Job> = Api::namespaced(scoped.clone(), "scoped");
    let status = api_error(jobs.create(&pp, &typed(job("j", "true", json!({})))).await.unwrap_err());
    assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        status.message,
        "jobs.batch is forbidden: User \"system:serviceaccount:scoped:runner\" cannot create resource \"jobs\" in API group \"batch\" in the namespace \"scoped\""
    );
    let other: Api<Pod> = Api::namespaced(scoped.clone(), "default");
    let status = api_error(other.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(
        status.message,
        "pods is forbidden: User \"system:serviceaccount:scoped:runner\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\""
    );
    let reviews: Api<SelfSubjectAccessReview> = Api::all(scoped.clone());
    let review = reviews.create(&pp, &typed(json!({"spec": {"resourceAttributes": {"namespace": "scoped", "verb": "create", "group": "", "resource": "pods", "subresource": "exec"}}}))).await.unwrap();
    assert!(!review.status.unwrap().allowed);
    let review = reviews
        .create(
            &pp,
            &typed(
                json!({"spec": {"resourceAttributes": {"namespace": "scoped", "verb": "list", "resource": "pods"}}}),
            ),
        )
        .await
        .unwrap();
    assert!(review.status.unwrap().allowed);
    // A token request below ten minutes is invalid.
    let request = http_request(
        "POST",
        "/api/v1/namespaces/scoped/serviceaccounts/runner/token",
        Some(json!({"spec": {"expirationSeconds": 60}})),
        None,
    );
    assert_eq!(api_error(server.client.request::<Value>(request).await.unwrap_err()).code, 422);

    // policy-forbidden and token-expired.
    server.faults(&["policy-forbidden"]).await;
    let policies: Api<NetworkPolicy> = Api::namespaced(server.client.clone(), "scoped");
    let status = api_error(
        policies
            .create(&pp, &typed(json!({"metadata": {"name": "deny"}, "spec": {"podSelector": {}}})))
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code, 403);
    assert_eq!(
        status.message,
        "networkpolicies.networking.k8s.io is forbidden: User \"kubernetes-admin\" cannot create resource \"networkpolicies\" in API group \"networking.k8s.io\" in the namespace \"scoped\""
    );
    server.faults(&[]).await;
    let created =
        policies.create(&pp, &typed(json!({"metadata": {"name": "deny"}, "spec": {"podSelector": {}}}))).await.unwrap();
    assert_eq!(created.spec.unwrap().policy_types, Some(vec!["Ingress".to_string()]));
    server.faults(&["token-expired"]).await;
    let admin: Api<Namespace> = Api::all(server.client.clone());
    assert_eq!(api_error(admin.list(&ListParams::default()).await.unwrap_err()).code, 401);
    server.faults(&[]).await;
    admin.list(&ListParams::default()).await.unwrap();
}

#[tokio::test]
async fn discovery_lists_watch_history_and_stats() {
    let server = Server::start(&[]).await;
    let version = server.client.apiserver_version().await.unwrap();
    assert_eq!(version.major, "1");
    let groups = server.client.list_api_groups().await.unwrap();
    assert!(groups.groups.iter().any(|g| g.name == "batch"));
    let batch = server.client.list_api_group_resources("batch/v1").await.unwrap();
    assert!(batch.resources.iter().any(|r| r.name == "jobs" && r.verbs.contains(&"watch".to_string())));
    let core = server.client.list_core_api_resources("v1").await.unwrap();
    assert!(core.resources.iter().any(|r| r.name == "pods/exec"));
    // The three namespaces and their default service accounts.
    let namespaces: Api<Namespace> = Api::all(server.client.clone());
    let names: Vec<String> = namespaces
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    assert_eq!(names, vec!["default", "knotless-runs", "kube-system"]);
    let sas: Api<ServiceAccount> = Api::all(server.client.clone());
    assert_eq!(sas.list(&ListParams::default()).await.unwrap().items.len(), 3);
    // Label selectors on lists.
    let jobs: Api<Job> = Api::namespaced(server.client.clone(), "knotless-runs");
    let pp = PostParams::default();
    for (name, tier) in [("a", "x"), ("b", "y"), ("c", "z")] {
        let mut j = job(name, "sleep 1000000", json!({}));
        j["metadata"]["labels"] = json!({"tier": tier});
        jobs.create(&pp, &typed(j)).await.unwrap();
    }
    let pick = |selector: &'static str| {
        let jobs = jobs.clone();
        async move {
            let list = jobs.list(&ListParams::default().labels(selector)).await.unwrap();
            list.items.into_iter().filter_map(|j| j.metadata.name).collect::<Vec<_>>()
        }
    };
    assert_eq!(pick("tier in (x,y)").await, vec!["a", "b"]);
    assert_eq!(pick("tier notin (x)").await, vec!["b", "c"]);
    assert_eq!(pick("tier!=z,tier").await, vec!["a", "b"]);
    assert_eq!(pick("!tier").await, Vec::<String>::new());
    // A watch from an old resourceVersion replays; one older than the history gets 410 Expired.
    let list = jobs.list(&ListParams::default()).await.unwrap();
    let rv = list.metadata.resource_version.unwrap();
    let first: u64 = rv.parse().unwrap();
    let mut stream = jobs.watch(&WatchParams::default().timeout(5), &(first - 2).to_string()).await.unwrap().boxed();
    match stream.try_next().await.unwrap() {
        Some(WatchEvent::Added(_)) | Some(WatchEvent::Modified(_)) => {}
        other => panic!("unexpected {other:?}"),
    }
    let mut stream = jobs.watch(&WatchParams::default().timeout(5), "1").await.unwrap().boxed();
    match stream.try_next().await.unwrap() {
        Some(WatchEvent::Error(e)) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("unexpected {other:?}"),
    }
    // Request accounting: each API request once, control endpoints never.
    server.fake("POST", "stats/reset", json!({})).await;
    namespaces.get("default").await.unwrap();
    jobs.list(&ListParams::default()).await.unwrap();
    jobs.create(&pp, &typed(job("d", "true", json!({})))).await.unwrap();
    let stats = server.fake("GET", "stats", json!(null)).await;
    assert_eq!(stats["requests"], json!(3), "{stats}");
    assert_eq!(stats["by"]["create jobs"], json!(1), "{stats}");
    assert_eq!(stats["by"]["get namespaces"], json!(1), "{stats}");
    let objects = server.fake("GET", "objects", json!(null)).await;
    assert!(objects.as_array().unwrap().iter().any(|o| o["kind"] == "Job"));
}
