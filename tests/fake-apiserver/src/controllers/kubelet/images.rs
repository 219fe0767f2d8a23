//! Images as the kubelet pulls them (pkg/kubelet/images/image_manager.go): references made
//! whole, a registry that refuses for now, and the back-off after a failed pull.

use super::*;

/// The fully qualified reference containerd resolves (`docker.io/library/busybox:latest`).
pub(super) fn full_reference(image: &str) -> String {
    let (path, digest) = match image.split_once('@') {
        Some((p, d)) => (p, Some(d)),
        None => (image, None),
    };
    let first = path.split('/').next().unwrap_or("");
    let has_domain = path.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    let mut name = if has_domain {
        path.to_string()
    } else if path.contains('/') {
        format!("docker.io/{path}")
    } else {
        format!("docker.io/library/{path}")
    };
    let last = name.rsplit('/').next().unwrap_or("");
    if !last.contains(':') && digest.is_none() {
        name.push_str(":latest");
    }
    match digest {
        Some(d) => format!("{name}@{d}"),
        None => name,
    }
}

/// Whether a reference parses (distribution/reference's grammar, simplified).
pub fn valid_reference(image: &str) -> bool {
    let (path, digest) = match image.split_once('@') {
        Some((p, d)) => (p, Some(d)),
        None => (image, None),
    };
    if let Some(digest) = digest {
        let Some((algorithm, hex)) = digest.split_once(':') else { return false };
        if algorithm.is_empty() || hex.len() < 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return false;
        }
    }
    let (name, tag) = match path.rsplit_once(':') {
        Some((n, t)) if !t.contains('/') => (n, Some(t)),
        _ => (path, None),
    };
    if let Some(tag) = tag {
        let ok = !tag.is_empty()
            && tag.len() <= 128
            && tag.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
            && tag.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !ok {
            return false;
        }
    }
    let components: Vec<&str> = name.split('/').collect();
    let domain = components.len() > 1
        && (components[0].contains('.') || components[0].contains(':') || components[0] == "localhost");
    components.iter().enumerate().all(|(i, c)| {
        if i == 0 && domain {
            return !c.is_empty() && c.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':'));
        }
        let bytes = c.as_bytes();
        !bytes.is_empty()
            && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'))
            && bytes[0].is_ascii_alphanumeric()
            && bytes[bytes.len() - 1].is_ascii_alphanumeric()
    })
}

/// Whether the registry has the image (`busybox`, `alpine` and the `--image` names).
pub(super) fn known(app: &Shared, image: &str) -> bool {
    let normal = |i: &str| full_reference(i);
    let wanted = normal(image);
    ["busybox", "busybox:1.36", "alpine", "alpine:3"]
        .iter()
        .map(|s| s.to_string())
        .chain(app.config.images.iter().cloned())
        .any(|i| normal(&i) == wanted)
}

pub(super) enum Pull {
    Done,
    /// Not now: try again after the duration; the container waits with this reason and message.
    Retry(Duration, &'static str, String),
    Deleted,
}

/// The image manager's `EnsureImageExists` for one container, once.
pub(super) async fn ensure_image(app: &Shared, pod: &Value, c: &mut Container) -> Pull {
    let (namespace, name) = util::ns_name(pod);
    let uid = text(pod, "/metadata/uid").to_string();
    let image = c.image.clone();
    let container = c.name.clone();
    let node = text(pod, "/spec/nodeName").to_string();
    let retry_soon = app.config.pull_backoff.max(Duration::from_millis(500));
    if !valid_reference(&image) {
        let message = format!(
            "Failed to apply default image tag \"{image}\": couldn't parse image name \"{image}\": invalid reference format"
        );
        event(app, pod, &container, "Warning", "InspectFailed", &message);
        event(app, pod, &container, "Warning", "Failed", "Error: InvalidImageName");
        return Pull::Retry(retry_soon, "InvalidImageName", message);
    }
    let present = app.lock().rt.nodes.get(&node).is_some_and(|n| n.images.contains(&full_reference(&image)));
    if c.policy == "Never" && !present {
        let message = format!("Container image \"{image}\" is not present with pull policy of Never");
        event(app, pod, &container, "Warning", "ErrImageNeverPull", &message);
        return Pull::Retry(retry_soon, "ErrImageNeverPull", message);
    }
    if present && c.policy != "Always" {
        let message = format!("Container image \"{image}\" already present on machine");
        event(app, pod, &container, "Normal", "Pulled", &message);
        return Pull::Done;
    }
    if let Some(until) = c.backoff_until
        && Instant::now() < until
    {
        let message = format!("Back-off pulling image \"{image}\"");
        event(app, pod, &container, "Normal", "BackOff", &message);
        event(app, pod, &container, "Warning", "Failed", "Error: ImagePullBackOff");
        return Pull::Retry(until - Instant::now(), "ImagePullBackOff", message);
    }
    event(app, pod, &container, "Normal", "Pulling", &format!("Pulling image \"{image}\""));
    let started = Instant::now();
    tokio::time::sleep(app.config.image_pull).await;
    if current(app, &namespace, &name, &uid).is_none_or(|p| p.pointer("/metadata/deletionTimestamp").is_some()) {
        return Pull::Deleted;
    }
    let reference = full_reference(&image);
    let denied = app.fault("pull-denied");
    if let Some(error) = registry_unavailable(app, &reference) {
        // A registry that is busy or down for now: the pull fails as any other (ErrImagePull,
        // then the back-off), and the next pull after the back-off may succeed.
        event(app, pod, &container, "Warning", "Failed", &format!("Failed to pull image \"{image}\": {error}"));
        event(app, pod, &container, "Warning", "Failed", "Error: ErrImagePull");
        return pull_backed_off(app, c, error);
    }
    if denied || !known(app, &image) {
        let error = if denied {
            format!(
                "rpc error: code = Unknown desc = failed to pull and unpack image \"{reference}\": failed to resolve reference \"{reference}\": pull access denied, repository does not exist or may require authorization: server message: insufficient_scope: authorization failed"
            )
        } else {
            format!(
                "rpc error: code = NotFound desc = failed to pull and unpack image \"{reference}\": failed to resolve reference \"{reference}\": {reference}: not found"
            )
        };
        event(app, pod, &container, "Warning", "Failed", &format!("Failed to pull image \"{image}\": {error}"));
        event(app, pod, &container, "Warning", "Failed", "Error: ErrImagePull");
        return pull_backed_off(app, c, error);
    }
    let took = go_duration(started.elapsed());
    let size = std::fs::metadata(&app.config.rootfs).map(|m| m.len()).unwrap_or(0);
    event(
        app,
        pod,
        &container,
        "Normal",
        "Pulled",
        &format!(
            "Successfully pulled image \"{image}\" in {took} ({took} including waiting). Image size: {size} bytes."
        ),
    );
    if let Some(node) = app.lock().rt.nodes.get_mut(&node) {
        node.images.insert(reference);
    }
    c.failures = 0;
    c.backoff_until = None;
    Pull::Done
}

/// A failed pull: the image back-off (pkg/kubelet/images/image_manager.go `backOff`, keyed by
/// pod, container and image: `--pull-backoff`, doubled after each failure up to 300 s) starts,
/// and the container waits with `ErrImagePull` until the next sync finds it backing off.
pub(super) fn pull_backed_off(app: &Shared, c: &mut Container, error: String) -> Pull {
    c.failures += 1;
    let backoff = app.config.pull_backoff.saturating_mul(1 << (c.failures - 1).min(16)).min(MAX_PULL_BACKOFF);
    c.backoff_until = Some(Instant::now() + backoff);
    // The next sync comes soon and finds the pull backing off.
    let after = (backoff / 4).min(Duration::from_secs(1)).max(Duration::from_millis(50));
    Pull::Retry(after, "ErrImagePull", error)
}

/// The error of a pull the registry answers with a temporary status, when a fault says it
/// does: `pull-rate-limited` once (the next pull's 429 `toomanyrequests`, as Docker Hub's rate
/// limit answers), `pull-unavailable` while it is set (503). The words are containerd's
/// (core/remotes/docker/fetcher.go and resolver.go: `unexpected status code URL: STATUS`, the
/// registry's error code after `Server message:`), wrapped as the CRI's pull error.
pub(super) fn registry_unavailable(app: &Shared, reference: &str) -> Option<String> {
    let (registry, path) = reference.split_once('/').unwrap_or(("docker.io", reference));
    let (repository, tag) = path.rsplit_once(':').unwrap_or((path, "latest"));
    let host = if registry == "docker.io" { "registry-1.docker.io" } else { registry };
    let manifest = format!("https://{host}/v2/{repository}/manifests/{tag}");
    let status = {
        let mut state = app.lock();
        let once = "pull-rate-limited";
        if state.rt.faults.contains(once) && !state.rt.fired.contains(once) {
            state.rt.fired.insert(once.to_string());
            "429 Too Many Requests - Server message: toomanyrequests: You have reached your pull rate limit. You may increase the limit by authenticating and upgrading: https://www.docker.com/increase-rate-limit"
        } else if state.rt.faults.contains("pull-unavailable") {
            "503 Service Unavailable"
        } else {
            return None;
        }
    };
    Some(format!(
        "rpc error: code = Unknown desc = failed to pull and unpack image \"{reference}\": failed to resolve reference \"{reference}\": unexpected status from HEAD request to {manifest}: {status}"
    ))
}
