//! What the deploy scripts call: `create serviceaccount|role|rolebinding|namespace|token`,
//! `auth can-i` (answered from the Roles bound to a token's service account; an admin
//! kubeconfig, without a fake token, may do anything) and `config view` with `-o json` or a
//! simple `-o jsonpath={.a.b[0].c}`.
//!
//! Tokens are `fake-token.<namespace>.<account>.<expiry unix seconds>`: past its expiry, every
//! call with it is Unauthorized.

use anyhow::bail;
use serde_json::{Value, json};

use crate::store::{Store, kind_of, text};
use crate::{Call, Cluster};

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The namespace, account and expiry of a fake token.
fn token_parts(token: &str) -> Option<(String, String, u64)> {
    let mut parts = token.strip_prefix("fake-token.")?.split('.');
    let (namespace, account, expiry) = (parts.next()?, parts.next()?, parts.next()?.parse().ok()?);
    Some((namespace.to_string(), account.to_string(), expiry))
}

/// Whether the kubeconfig's token is a fake token past its expiry.
pub fn token_expired(cluster: &Cluster) -> bool {
    cluster.token.as_deref().and_then(token_parts).is_some_and(|(_, _, expiry)| expiry <= now())
}

fn flag_values(args: &[String], name: &str) -> Vec<String> {
    let mut values = Vec::new();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if let Some(value) = arg.strip_prefix(&format!("{name}=")) {
            values.extend(value.split(',').map(str::to_string));
        } else if arg == name
            && let Some(value) = iter.next()
        {
            values.extend(value.split(',').map(str::to_string));
        }
    }
    values
}

fn seconds(duration: &str) -> u64 {
    let (number, unit) = duration.split_at(duration.trim_end_matches(|c: char| c.is_ascii_alphabetic()).len());
    let number: u64 = number.parse().unwrap_or(3600);
    number
        * match unit {
            "h" => 3600,
            "m" => 60,
            _ => 1,
        }
}

/// `create KIND NAME ...` without a manifest.
pub fn create(cluster: &Cluster, namespace: &str, args: &[String]) -> anyhow::Result<i32> {
    let (what, name) = (args.first().map(String::as_str).unwrap_or(""), args.get(1).cloned().unwrap_or_default());
    if what == "token" {
        let duration = flag_values(args, "--duration").first().map(|d| seconds(d)).unwrap_or(3600);
        println!("fake-token.{namespace}.{name}.{}", now() + duration);
        return Ok(0);
    }
    let object = match what {
        "serviceaccount" | "sa" => json!({"kind": "ServiceAccount", "apiVersion": "v1"}),
        "namespace" | "ns" => json!({"kind": "Namespace", "apiVersion": "v1"}),
        "role" => {
            let rule = json!({"verbs": flag_values(args, "--verb"), "resources": flag_values(args, "--resource")});
            json!({"kind": "Role", "apiVersion": "rbac.authorization.k8s.io/v1", "rules": [rule]})
        }
        "rolebinding" => json!({"kind": "RoleBinding", "apiVersion": "rbac.authorization.k8s.io/v1",
            "roleRef": {"kind": "Role", "name": flag_values(args, "--role").first()},
            "subjects": flag_values(args, "--serviceaccount").iter().map(|sa| {
                let (ns, account) = sa.split_once(':').unwrap_or((namespace, sa));
                json!({"kind": "ServiceAccount", "namespace": ns, "name": account})
            }).collect::<Vec<_>>()}),
        other => bail!("error: fake-kubectl cannot create {other:?}"),
    };
    let mut object = object;
    object["metadata"] = json!({"name": name, "namespace": namespace});
    let mut store = Store::open(&cluster.dir)?;
    let kind = kind_of(&object).to_string();
    if store.find(&kind, namespace, &name).is_some() {
        bail!("error: failed to create {}: {}s \"{name}\" already exists", what, what);
    }
    store.data.objects.push(object);
    store.save()?;
    println!("{what}/{name} created");
    Ok(0)
}

/// `auth can-i VERB RESOURCE`: `yes` (0) or `no` (1).
pub fn can_i(cluster: &Cluster, namespace: &str, args: &[String]) -> anyhow::Result<i32> {
    let words: Vec<&String> = args.iter().skip(1).filter(|arg| !arg.starts_with('-')).collect();
    let (Some(verb), Some(resource)) = (words.first(), words.get(1)) else {
        bail!("error: you must specify VERB RESOURCE")
    };
    let allowed = match cluster.token.as_deref().and_then(token_parts) {
        None => true,
        Some((account_ns, account, _)) => {
            let store = Store::open(&cluster.dir)?;
            let objects = &store.data.objects;
            let roles = objects.iter().filter(|binding| {
                kind_of(binding) == "RoleBinding"
                    && text(binding, "/metadata/namespace") == namespace
                    && binding["subjects"].as_array().is_some_and(|subjects| {
                        subjects.iter().any(|s| text(s, "/name") == account && text(s, "/namespace") == account_ns)
                    })
            });
            let resource = resource.split('.').next().unwrap_or("");
            roles.into_iter().any(|binding| {
                let role = text(binding, "/roleRef/name");
                objects
                    .iter()
                    .filter(|r| {
                        kind_of(r) == "Role"
                            && text(r, "/metadata/name") == role
                            && text(r, "/metadata/namespace") == namespace
                    })
                    .any(|role| {
                        role["rules"].as_array().into_iter().flatten().any(|rule| {
                            let has = |list: &str, word: &str| {
                                rule[list].as_array().is_some_and(|items| items.iter().any(|i| i == word || i == "*"))
                            };
                            has("verbs", verb)
                                && (has("resources", resource)
                                    || has("resources", resource.trim_end_matches('s'))
                                    || has("resources", &format!("{resource}s")))
                        })
                    })
            })
        }
    };
    println!("{}", if allowed { "yes" } else { "no" });
    Ok(if allowed { 0 } else { 1 })
}

/// `config view [--minify] [--raw] -o json|jsonpath=...`.
pub fn config(call: &Call, args: &[String]) -> anyhow::Result<i32> {
    let Some(path) = &call.kubeconfig else { bail!("error: no kubeconfig") };
    let mut config: Value = serde_saphyr::from_str(&std::fs::read_to_string(path)?)?;
    if args.iter().any(|arg| arg == "--minify") {
        let current = call.context.clone().unwrap_or_else(|| text(&config, "/current-context").to_string());
        let keep = |config: &Value, list: &str, name: &str| {
            json!(
                config[list]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|item| text(item, "/name") == name)
                    .collect::<Vec<_>>()
            )
        };
        let contexts = keep(&config, "contexts", &current);
        let cluster = text(&contexts, "/0/context/cluster").to_string();
        let user = text(&contexts, "/0/context/user").to_string();
        config["clusters"] = keep(&config, "clusters", &cluster);
        config["users"] = keep(&config, "users", &user);
        config["contexts"] = contexts;
    }
    let output = args
        .iter()
        .position(|arg| arg == "-o")
        .and_then(|at| args.get(at + 1))
        .cloned()
        .or_else(|| {
            args.iter().find_map(|arg| arg.strip_prefix("-o=").or(arg.strip_prefix("--output=")).map(str::to_string))
        })
        .unwrap_or_else(|| "json".into());
    match output.strip_prefix("jsonpath=") {
        Some(path) => {
            let pointer: String = path
                .trim_matches(|c| c == '{' || c == '}')
                .replace('[', ".")
                .replace(']', "")
                .split('.')
                .filter(|p| !p.is_empty())
                .map(|p| format!("/{p}"))
                .collect();
            match config.pointer(&pointer) {
                Some(Value::String(text)) => print!("{text}"),
                Some(other) => print!("{other}"),
                None => {}
            }
        }
        None => println!("{}", serde_json::to_string_pretty(&config)?),
    }
    Ok(0)
}
