//! The requests of a run's ending (the Job's delete, a forced delete of its pod), each answered
//! within the ending's bound however the API server answers: one that refuses (401, 403) or
//! cannot be reached is an error at once; one that is overloaded or failing (429, 5xx) is
//! asked again each second until the bound, and its last answer is the error. Made through the
//! client without kube-rs's own retries, which would wait minutes on a server that keeps
//! answering 503.

use std::time::{Duration, Instant};

use knotless_protocol::ExecutorError;
use kube::api::Api;
use kube::core::Status;

use crate::api::Client;

/// How long the requests of an ending may take, all told: the run ends within 10 s of the
/// cause, with the answer to send.
pub const BOUND: Duration = Duration::from_secs(7);

/// How long an ending waits before it asks an overloaded or failing server again (the
/// `Retry-After` an API server sends with a 429).
const AGAIN_AFTER: Duration = Duration::from_secs(1);

/// The namespaced API of `K` through the client without retries.
pub fn api<K>(client: &Client, namespace: &str) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as kube::Resource>::DynamicType: Default,
{
    Api::namespaced(client.once.clone(), namespace)
}

/// Makes the request `call` makes until it is answered, or refused for good, or `deadline`
/// passes; an answer `expected` accepts (a NotFound of a delete) is `None`.
pub async fn request<T, F, Fut>(
    client: &Client,
    what: &str,
    deadline: Instant,
    expected: fn(&Status) -> bool,
    mut call: F,
) -> Result<Option<T>, ExecutorError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let mut last: Option<ExecutorError> = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let answer = match tokio::time::timeout(left, call()).await {
            Ok(answer) => answer,
            Err(_) => {
                let said = last.map(|error| format!(" (it answered: {})", error.message)).unwrap_or_default();
                return Err(ExecutorError::infrastructure(format!(
                    "{what}: the API server {} did not answer within {} s{said}",
                    client.server,
                    BOUND.as_secs()
                )));
            }
        };
        let error = match answer {
            Ok(value) => return Ok(Some(value)),
            Err(kube::Error::Api(status)) if expected(&status) => return Ok(None),
            Err(error) => error,
        };
        let transient = matches!(&error, kube::Error::Api(status) if status.code == 429 || status.code >= 500);
        let error = client.error(what, &error);
        if !transient || Instant::now() + AGAIN_AFTER >= deadline {
            return Err(error);
        }
        tracing::debug!(what, error = %error.message, "asking again");
        last = Some(error);
        tokio::time::sleep(AGAIN_AFTER).await;
    }
}
