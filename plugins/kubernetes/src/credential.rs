//! The runner's scoped credential (`knotless-executor-kubernetes scoped-kubeconfig`, which
//! `knotless-run kubeconfig scoped` runs): from an admin kubeconfig, through the same client
//! as the executor, a namespace, a ServiceAccount, a namespaced Role (Jobs, pods, pods/log,
//! pods/exec, events, NetworkPolicies; no secrets, nothing cluster-wide) bound to it, and a
//! token of the given lifetime from the TokenRequest API, written as a kubeconfig atomically
//! (a temporary file beside it, mode 0600, then a rename) once checked with
//! SelfSubjectAccessReviews: it may create Jobs and exec into pods, and may not read secrets
//! or nodes. The token is never printed.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

/// The resources the runner's Role grants, and the verbs.
pub const RESOURCES: &[&str] = &["jobs", "pods", "pods/log", "pods/exec", "events", "networkpolicies"];
const VERBS: &[&str] = &["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"];

/// What to make.
#[derive(Debug, Clone)]
pub struct Scoped {
    /// The admin kubeconfig.
    pub admin: PathBuf,
    /// The namespace of the runs.
    pub namespace: String,
    /// Where the scoped kubeconfig goes.
    pub output: PathBuf,
    /// The ServiceAccount (and Role, RoleBinding) name.
    pub account: String,
    /// The token's lifetime.
    pub seconds: i64,
}

/// One question of the check: may the credential do this?
struct Question {
    verb: &'static str,
    resource: &'static str,
    subresource: &'static str,
    group: &'static str,
    namespaced: bool,
    want: bool,
}

/// What a scoped credential must and must not be allowed.
const QUESTIONS: &[Question] = &[
    Question { verb: "create", resource: "jobs", subresource: "", group: "batch", namespaced: true, want: true },
    Question { verb: "create", resource: "pods", subresource: "exec", group: "", namespaced: true, want: true },
    // A Job's leftover pods are deleted by their labels, at stop and in the orphan sweep.
    Question { verb: "deletecollection", resource: "pods", subresource: "", group: "", namespaced: true, want: true },
    Question {
        verb: "create",
        resource: "networkpolicies",
        subresource: "",
        group: "networking.k8s.io",
        namespaced: true,
        want: true,
    },
    // A run's policy is given its pod as owner, so the garbage collector deletes it after the pod.
    Question {
        verb: "patch",
        resource: "networkpolicies",
        subresource: "",
        group: "networking.k8s.io",
        namespaced: true,
        want: true,
    },
    Question { verb: "get", resource: "secrets", subresource: "", group: "", namespaced: true, want: false },
    Question { verb: "get", resource: "nodes", subresource: "", group: "", namespaced: false, want: false },
];

/// A client of a kubeconfig (its current context).
async fn client(path: &Path) -> anyhow::Result<(kube::Client, kube::Config)> {
    let file = Kubeconfig::read_from(path).with_context(|| format!("cannot read {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("cannot use {}", path.display()))?;
    let client = kube::Client::try_from(config.clone()).context("cannot make a Kubernetes client")?;
    Ok((client, config))
}

/// Creates `object` unless one of its name exists.
async fn ensure<K>(api: &Api<K>, object: &K, what: &str) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(()),
        Err(error) => Err(anyhow::Error::new(error).context(format!("cannot create {what}"))),
    }
}

/// Makes the scoped kubeconfig; what was written, for a message.
pub async fn scoped(what: &Scoped, owner: Option<(u32, u32)>) -> anyhow::Result<String> {
    let (admin, config) = client(&what.admin).await?;
    let (namespace, account) = (what.namespace.as_str(), what.account.as_str());
    let accounts = grant(&admin, namespace, account).await?;
    let token = issue_token(&accounts, namespace, account, what.seconds).await?;
    let server = config.cluster_url.to_string();
    let ca = read_ca(&what.admin)?;
    let text = kubeconfig(&server, ca.as_deref(), namespace, account, &token);
    write_checked(what, owner, &text).await?;
    Ok(format!("wrote {} for {namespace}/{account}, valid for {} s", what.output.display(), what.seconds))
}

/// Makes, unless they exist, the namespace, the ServiceAccount `account` in it, its Role
/// ([`RESOURCES`], [`VERBS`]) and the RoleBinding of the one to the other; returns the
/// namespace's ServiceAccounts.
async fn grant(admin: &kube::Client, namespace: &str, account: &str) -> anyhow::Result<Api<ServiceAccount>> {
    let meta = |name: &str| ObjectMeta { name: Some(name.to_string()), ..ObjectMeta::default() };
    ensure(
        &Api::<Namespace>::all(admin.clone()),
        &Namespace { metadata: meta(namespace), ..Namespace::default() },
        &format!("the namespace {namespace}"),
    )
    .await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    let service_account = ServiceAccount { metadata: meta(account), ..ServiceAccount::default() };
    ensure(&accounts, &service_account, &format!("the ServiceAccount {namespace}/{account}")).await?;
    let role = Role { metadata: meta(account), rules: Some(role_rules()) };
    ensure(&Api::<Role>::namespaced(admin.clone(), namespace), &role, &format!("the Role {namespace}/{account}"))
        .await?;
    let binding = RoleBinding {
        metadata: meta(account),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: account.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: account.into(),
            namespace: Some(namespace.into()),
            ..Subject::default()
        }]),
    };
    ensure(
        &Api::<RoleBinding>::namespaced(admin.clone(), namespace),
        &binding,
        &format!("the RoleBinding {namespace}/{account}"),
    )
    .await?;
    Ok(accounts)
}

/// The rules of the runner's Role: every one of [`VERBS`] on each of [`RESOURCES`], in its
/// API group.
fn role_rules() -> Vec<PolicyRule> {
    RESOURCES
        .iter()
        .map(|resource| {
            let group = match *resource {
                "jobs" => "batch",
                "networkpolicies" => "networking.k8s.io",
                _ => "",
            };
            PolicyRule {
                api_groups: Some(vec![group.to_string()]),
                resources: Some(vec![resource.to_string()]),
                verbs: VERBS.iter().map(|verb| verb.to_string()).collect(),
                ..PolicyRule::default()
            }
        })
        .collect()
}

/// A token of the ServiceAccount `account`, valid for `seconds`, from the TokenRequest API.
async fn issue_token(
    accounts: &Api<ServiceAccount>,
    namespace: &str,
    account: &str,
    seconds: i64,
) -> anyhow::Result<String> {
    let request = TokenRequest {
        metadata: ObjectMeta::default(),
        spec: Some(TokenRequestSpec { expiration_seconds: Some(seconds), ..TokenRequestSpec::default() }),
        status: None,
    };
    let issued = accounts
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .with_context(|| format!("cannot issue a token for {namespace}/{account}"))?;
    let token = issued.status.and_then(|status| status.token).filter(|token| !token.is_empty());
    let Some(token) = token else { bail!("the API server issued no token for {namespace}/{account}") };
    Ok(token)
}

/// Writes the kubeconfig `text` to a temporary file beside `what.output` (mode 0600), checks
/// what it may do ([`check`]), gives it to `owner`, then renames it into place.
async fn write_checked(what: &Scoped, owner: Option<(u32, u32)>, text: &str) -> anyhow::Result<()> {
    let dir = what.output.parent().filter(|dir| !dir.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let temporary = tempfile::Builder::new()
        .prefix(".scoped-kubeconfig.")
        .tempfile_in(dir)
        .with_context(|| format!("cannot write in {}", dir.display()))?;
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mut file = temporary.as_file();
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
    }
    let answers = check(temporary.path(), &what.namespace).await?;
    let wrong: Vec<&String> = answers.iter().filter(|(_, right)| !right).map(|(said, _)| said).collect();
    if !wrong.is_empty() {
        bail!(
            "the scoped credential is not what the runner needs: {}",
            wrong.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
        );
    }
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(temporary.path(), Some(uid), Some(gid))
            .context("cannot give the kubeconfig to its owner")?;
    }
    temporary.persist(&what.output).with_context(|| format!("cannot write {}", what.output.display()))?;
    Ok(())
}

/// The `certificate-authority-data` of the admin kubeconfig's current cluster, if any.
fn read_ca(admin: &Path) -> anyhow::Result<Option<String>> {
    let file = Kubeconfig::read_from(admin).with_context(|| format!("cannot read {}", admin.display()))?;
    let context = file.current_context.clone().unwrap_or_default();
    let cluster = file
        .contexts
        .iter()
        .find(|named| named.name == context)
        .and_then(|named| named.context.as_ref())
        .map(|context| context.cluster.clone())
        .unwrap_or_default();
    let ca = file
        .clusters
        .iter()
        .find(|named| named.name == cluster)
        .and_then(|named| named.cluster.as_ref())
        .and_then(|cluster| cluster.certificate_authority_data.clone());
    Ok(ca)
}

/// The scoped kubeconfig's text.
fn kubeconfig(server: &str, ca: Option<&str>, namespace: &str, account: &str, token: &str) -> String {
    let quote = |text: &str| serde_json::to_string(text).unwrap_or_default();
    let ca = ca.map(|ca| format!("    certificate-authority-data: {}\n", quote(ca))).unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: {a}\nclusters:\n- name: {a}\n  cluster:\n    server: {s}\n{ca}\
         contexts:\n- name: {a}\n  context:\n    cluster: {a}\n    user: {a}\n    namespace: {n}\nusers:\n- name: {a}\n  user:\n    token: {t}\n",
        a = quote(account),
        s = quote(server),
        n = quote(namespace),
        t = quote(token),
    )
}

/// Asks the API server, as the credential of `kubeconfig`, each question of the check: the
/// answer as said (`create jobs: yes`) and whether it is the one wanted.
pub async fn check(kubeconfig: &Path, namespace: &str) -> anyhow::Result<Vec<(String, bool)>> {
    let (client, _) = client(kubeconfig).await?;
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client);
    let mut answers = Vec::new();
    for question in QUESTIONS {
        let review = SelfSubjectAccessReview {
            metadata: ObjectMeta::default(),
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(question.verb.into()),
                    resource: Some(question.resource.into()),
                    subresource: (!question.subresource.is_empty()).then(|| question.subresource.into()),
                    group: Some(question.group.into()),
                    namespace: question.namespaced.then(|| namespace.to_string()),
                    ..ResourceAttributes::default()
                }),
                non_resource_attributes: None,
            },
            status: None,
        };
        let answered = reviews.create(&PostParams::default(), &review).await.with_context(|| {
            format!("cannot ask whether the credential may {} {}", question.verb, question.resource)
        })?;
        let allowed = answered.status.is_some_and(|status| status.allowed);
        let what = if question.subresource.is_empty() {
            question.resource.to_string()
        } else {
            format!("{}/{}", question.resource, question.subresource)
        };
        answers.push((
            format!("{} {what}: {}", question.verb, if allowed { "yes" } else { "no" }),
            allowed == question.want,
        ));
    }
    Ok(answers)
}
