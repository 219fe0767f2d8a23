//! The resources served and their discovery documents (`APIVersions`, `APIGroupList`,
//! `APIResourceList`) as staging/src/k8s.io/apiserver/pkg/endpoints/discovery builds them, with
//! the verbs each REST storage implements (pkg/registry/*/storage).

use serde_json::{Value, json};

/// One served resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resource {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub verbs: &'static [&'static str],
    pub short: &'static [&'static str],
}

impl Resource {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.to_string() } else { format!("{}/{}", self.group, self.version) }
    }
    /// The key objects of this resource are stored under.
    pub fn key(&self) -> &'static str {
        self.plural
    }
    pub fn can(&self, verb: &str) -> bool {
        self.verbs.contains(&verb)
    }
}

const CRUD: &[&str] = &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];

pub const RESOURCES: &[Resource] = &[
    Resource {
        group: "",
        version: "v1",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        namespaced: false,
        verbs: &["create", "delete", "get", "list", "patch", "update", "watch"],
        short: &["ns"],
    },
    Resource {
        group: "",
        version: "v1",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        namespaced: false,
        verbs: &["get", "list", "watch"],
        short: &["no"],
    },
    Resource {
        group: "",
        version: "v1",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        namespaced: true,
        verbs: CRUD,
        short: &["po"],
    },
    Resource {
        group: "",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        verbs: CRUD,
        short: &["ev"],
    },
    Resource {
        group: "",
        version: "v1",
        plural: "serviceaccounts",
        singular: "serviceaccount",
        kind: "ServiceAccount",
        namespaced: true,
        verbs: CRUD,
        short: &["sa"],
    },
    Resource {
        group: "batch",
        version: "v1",
        plural: "jobs",
        singular: "job",
        kind: "Job",
        namespaced: true,
        verbs: CRUD,
        short: &[],
    },
    Resource {
        group: "networking.k8s.io",
        version: "v1",
        plural: "networkpolicies",
        singular: "networkpolicy",
        kind: "NetworkPolicy",
        namespaced: true,
        verbs: CRUD,
        short: &["netpol"],
    },
    Resource {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "roles",
        singular: "role",
        kind: "Role",
        namespaced: true,
        verbs: CRUD,
        short: &[],
    },
    Resource {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "rolebindings",
        singular: "rolebinding",
        kind: "RoleBinding",
        namespaced: true,
        verbs: CRUD,
        short: &[],
    },
    Resource {
        group: "authorization.k8s.io",
        version: "v1",
        plural: "selfsubjectaccessreviews",
        singular: "selfsubjectaccessreview",
        kind: "SelfSubjectAccessReview",
        namespaced: false,
        verbs: &["create"],
        short: &[],
    },
];

/// Subresources: (resource, subresource, kind, verbs).
const SUBRESOURCES: &[(&str, &str, &str, &[&str])] = &[
    ("pods", "exec", "PodExecOptions", &["create", "get"]),
    ("pods", "log", "Pod", &["get"]),
    ("pods", "status", "Pod", &["get", "patch", "update"]),
    ("jobs", "status", "Job", &["get", "patch", "update"]),
    ("serviceaccounts", "token", "TokenRequest", &["create"]),
];

/// The served resource of `group`/`version` named `plural`.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
    RESOURCES.iter().find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The resource of `kind` (any group).
pub fn by_key(plural: &str) -> Option<&'static Resource> {
    RESOURCES.iter().find(|r| r.plural == plural)
}

/// Whether `resource/sub` is served.
pub fn has_subresource(plural: &str, sub: &str) -> bool {
    SUBRESOURCES.iter().any(|(r, s, _, _)| *r == plural && *s == sub)
}

/// The groups other than core, with their one version.
fn groups() -> Vec<&'static str> {
    let mut groups: Vec<&'static str> = RESOURCES.iter().map(|r| r.group).filter(|g| !g.is_empty()).collect();
    groups.dedup();
    groups
}

/// `GET /api`.
pub fn core_versions(server: &str) -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"],
           "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server}]})
}

/// `GET /apis`.
pub fn group_list() -> Value {
    let groups: Vec<Value> = groups()
        .into_iter()
        .map(|g| {
            let gv = json!({"groupVersion": format!("{g}/v1"), "version": "v1"});
            json!({"name": g, "versions": [gv.clone()], "preferredVersion": gv})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `GET /apis/{group}`.
pub fn group(name: &str) -> Option<Value> {
    groups().contains(&name).then(|| {
        let gv = json!({"groupVersion": format!("{name}/v1"), "version": "v1"});
        json!({"kind": "APIGroup", "apiVersion": "v1", "name": name, "versions": [gv.clone()], "preferredVersion": gv})
    })
}

/// `GET /api/v1` or `/apis/{group}/{version}`.
pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for r in RESOURCES.iter().filter(|r| r.group == group && r.version == version) {
        let mut entry = json!({"name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
                               "kind": r.kind, "verbs": r.verbs});
        if !r.short.is_empty() {
            entry["shortNames"] = json!(r.short);
        }
        resources.push(entry);
        for (_, sub, kind, verbs) in SUBRESOURCES.iter().filter(|(p, ..)| *p == r.plural) {
            let mut entry = json!({"name": format!("{}/{sub}", r.plural), "singularName": "",
                                   "namespaced": r.namespaced, "kind": kind, "verbs": verbs});
            if *kind == "TokenRequest" {
                entry["group"] = json!("authentication.k8s.io");
                entry["version"] = json!("v1");
            }
            resources.push(entry);
        }
    }
    if resources.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}))
}
