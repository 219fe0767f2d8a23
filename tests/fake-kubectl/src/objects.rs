//! `apply`/`create -f -`, `get` and `delete` on the object store.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::bail;
use serde_json::{Value, json};

use crate::pods;
use crate::store::{Store, kind_of, matches_fields, matches_labels, text};

/// The kind of a resource word (`pods`, `po`, `job.batch`, ...).
pub fn kind(resource: &str) -> anyhow::Result<&'static str> {
    let word = resource.split('.').next().unwrap_or("").to_ascii_lowercase();
    Ok(match word.as_str() {
        "pod" | "pods" | "po" => "Pod",
        "job" | "jobs" => "Job",
        "networkpolicy" | "networkpolicies" | "netpol" => "NetworkPolicy",
        "event" | "events" | "ev" => "Event",
        "secret" | "secrets" => "Secret",
        "serviceaccount" | "serviceaccounts" | "sa" => "ServiceAccount",
        "role" | "roles" => "Role",
        "rolebinding" | "rolebindings" => "RoleBinding",
        "node" | "nodes" => "Node",
        "namespace" | "namespaces" | "ns" => "Namespace",
        _ => bail!("error: the server doesn't have a resource type \"{resource}\""),
    })
}

/// The `kind.group` kubectl prints.
fn printed(kind: &str) -> &'static str {
    match kind {
        "Job" => "job.batch",
        "NetworkPolicy" => "networkpolicy.networking.k8s.io",
        "Role" => "role.rbac.authorization.k8s.io",
        "RoleBinding" => "rolebinding.rbac.authorization.k8s.io",
        "ServiceAccount" => "serviceaccount",
        "Secret" => "secret",
        "Event" => "event",
        _ => "pod",
    }
}

/// Applies (or creates) the objects of a JSON or YAML manifest.
pub fn apply(
    dir: &Path,
    namespace: &str,
    manifest: &[u8],
    create: bool,
    injected: &BTreeSet<String>,
) -> anyhow::Result<i32> {
    let value: Value = match serde_json::from_slice(manifest) {
        Ok(value) => value,
        Err(_) => serde_saphyr::from_slice(manifest)
            .map_err(|error| anyhow::anyhow!("error: error parsing manifest: {error}"))?,
    };
    let items =
        if kind_of(&value) == "List" { value["items"].as_array().cloned().unwrap_or_default() } else { vec![value] };
    let mut store = Store::open(dir)?;
    for mut object in items {
        let kind = kind_of(&object).to_string();
        if object.pointer("/metadata/namespace").is_none() {
            object["metadata"]["namespace"] = json!(namespace);
        }
        let name = text(&object, "/metadata/name").to_string();
        let ns = text(&object, "/metadata/namespace").to_string();
        if kind == "NetworkPolicy" && injected.contains("policy-denied") {
            bail!(
                "Error from server (Forbidden): error when creating \"STDIN\": networkpolicies.networking.k8s.io is forbidden: \
                 User \"system:serviceaccount:{ns}:knotless-runner\" cannot create resource \"networkpolicies\" in API group \
                 \"networking.k8s.io\" in the namespace \"{ns}\""
            );
        }
        match store.find(&kind, &ns, &name) {
            Some(_) if create => {
                bail!(
                    "Error from server (AlreadyExists): error when creating \"STDIN\": {}s \"{name}\" already exists",
                    printed(&kind)
                )
            }
            Some(index) => {
                store.data.objects[index] = object;
                println!("{}/{name} configured", printed(&kind));
            }
            None => {
                object["metadata"]["uid"] = json!(format!("uid-{}", store.next()));
                if kind == "Job" {
                    pods::create_for_job(&mut store, &object, injected)?;
                }
                store.data.objects.push(object);
                println!("{}/{name} created", printed(&kind));
            }
        }
    }
    store.save()?;
    Ok(0)
}

/// Options of `get` and `delete`: names, `-l`, `--field-selector`, `-o`, `--ignore-not-found`.
#[derive(Default)]
struct Query {
    kind: String,
    names: Vec<String>,
    labels: Option<String>,
    fields: Option<String>,
    output: Option<String>,
    ignore_not_found: bool,
}

fn query(args: &[String]) -> anyhow::Result<Query> {
    let mut query = Query::default();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with('-') => (flag, Some(value.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = || inline.clone().or_else(|| iter.next().cloned()).unwrap_or_default();
        match flag {
            "-l" | "--selector" => query.labels = Some(value()),
            "--field-selector" => query.fields = Some(value()),
            "-o" | "--output" => query.output = Some(value()),
            "--ignore-not-found" => query.ignore_not_found = inline.as_deref() != Some("false"),
            flag if flag.starts_with('-') => {}
            word if query.kind.is_empty() => query.kind = kind(word)?.to_string(),
            name => query.names.push(name.to_string()),
        }
    }
    if query.kind.is_empty() {
        bail!("error: you must specify the type of resource");
    }
    Ok(query)
}

fn selected<'a>(store: &'a Store, query: &Query, namespace: &str) -> Vec<&'a Value> {
    store
        .data
        .objects
        .iter()
        .filter(|object| kind_of(object) == query.kind && text(object, "/metadata/namespace") == namespace)
        .filter(|object| {
            query.names.is_empty() || query.names.iter().any(|name| name == text(object, "/metadata/name"))
        })
        .filter(|object| query.labels.as_deref().is_none_or(|selector| matches_labels(object, selector)))
        .filter(|object| query.fields.as_deref().is_none_or(|selector| matches_fields(object, selector)))
        .collect()
}

/// `get`.
pub fn get(dir: &Path, namespace: &str, args: &[String]) -> anyhow::Result<i32> {
    let query = query(args)?;
    let store = Store::open(dir)?;
    let found = selected(&store, &query, namespace);
    for name in &query.names {
        if !found.iter().any(|object| text(object, "/metadata/name") == name) && !query.ignore_not_found {
            bail!(
                "Error from server (NotFound): {}s \"{name}\" not found",
                printed(&query.kind).split('.').next().unwrap_or("")
            );
        }
    }
    let single = query.names.len() == 1;
    match query.output.as_deref() {
        Some("json") if single => println!("{}", serde_json::to_string_pretty(&found[0])?),
        Some("json") => {
            println!("{}", serde_json::to_string_pretty(&json!({"apiVersion": "v1", "kind": "List", "items": found}))?)
        }
        Some("name") => {
            found.iter().for_each(|object| println!("{}/{}", printed(&query.kind), text(object, "/metadata/name")))
        }
        _ => found.iter().for_each(|object| println!("{}", text(object, "/metadata/name"))),
    }
    Ok(0)
}

/// `delete`: Jobs take their pods with them; pods' processes are killed.
pub fn delete(dir: &Path, namespace: &str, args: &[String]) -> anyhow::Result<i32> {
    let query = query(args)?;
    let mut store = Store::open(dir)?;
    let doomed: BTreeSet<String> =
        selected(&store, &query, namespace).iter().map(|object| text(object, "/metadata/name").to_string()).collect();
    for name in &query.names {
        if !doomed.contains(name) && !query.ignore_not_found {
            bail!(
                "Error from server (NotFound): {}s \"{name}\" not found",
                printed(&query.kind).split('.').next().unwrap_or("")
            );
        }
    }
    let kind = query.kind.clone();
    let removed = pods::delete_where(&mut store, &|object| {
        kind_of(object) == kind
            && text(object, "/metadata/namespace") == namespace
            && doomed.contains(text(object, "/metadata/name"))
    });
    store.save()?;
    for object in removed.iter().filter(|object| kind_of(object) == kind) {
        println!("{} \"{}\" deleted", printed(&kind), text(object, "/metadata/name"));
    }
    Ok(0)
}
