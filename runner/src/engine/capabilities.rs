//! What the executor declared in its handshake decides what a run asks of it: no `image` in
//! `start` for one that takes no images, no cache transfer with one that declares no caches,
//! and no run at all when the workflow needs what the executor cannot give (services, secrets
//! kept to one step).

use knotless_protocol::messages::Capabilities;

use super::{CacheLease, Ended, RunPlan};
use crate::report::RunLog;
use crate::report::RunStatus;
use crate::workflow::Workflow;

/// The image `start` names: the workflow's, for an executor that declares `images`. An image
/// that an executor without it would be sent is dropped, and the log says so.
pub(super) fn start_image(
    workflow: &Workflow,
    capabilities: Option<&Capabilities>,
    executor: &str,
    log: &mut RunLog<'_>,
) -> Option<String> {
    let image = workflow.image.as_ref()?;
    if capabilities.is_some_and(|capabilities| capabilities.images) {
        return Some(image.clone());
    }
    log.note(format!("image {image} ignored: executor {executor} does not take images (it declares images: false)"));
    None
}

/// The caches a run streams in and back: all of them with an executor that declares `caches`,
/// none with another, which the log says once.
pub(super) fn usable_caches<'plan>(
    caches: &'plan [CacheLease],
    capabilities: Option<&Capabilities>,
    executor: &str,
    log: &mut RunLog<'_>,
) -> &'plan [CacheLease] {
    if caches.is_empty() || capabilities.is_some_and(|capabilities| capabilities.caches) {
        return caches;
    }
    log.note(format!("caches: not supported by executor {executor} (it declares caches: false)"));
    &[]
}

/// Why the run cannot go through an executor with `capabilities`, if it cannot: services when
/// the executor declares `services: false`, and a step that asks for a secret when it declares
/// `secrets: false` (it cannot keep a secret to one step), are configuration errors, found
/// before any environment starts.
pub(super) fn refusal(plan: &RunPlan, capabilities: &Capabilities, executor: &str) -> Option<Ended> {
    if let (false, Some(service)) = (capabilities.services, plan.workflow.services.first()) {
        return Some(Ended {
            status: RunStatus::Error,
            cause: format!(
                "workflow {} has services ({} first), but executor {executor} declares services: false, so it runs \
                 none: run the workflow with an executor that runs services (docker, kubernetes)",
                plan.workflow.name, service.name
            ),
        });
    }
    if capabilities.secrets {
        return None;
    }
    let step = plan.workflow.steps.iter().find(|step| !step.secrets.is_empty())?;
    Some(Ended {
        status: RunStatus::Error,
        cause: format!(
            "step {} asks for secrets ({}), but executor {executor} declares secrets: false, so no secret goes \
             through it: run the workflow with an executor that keeps secrets, or drop the step's secrets",
            step.name,
            step.secrets.join(", ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mask::Masker;
    use crate::report::tests::Lines;

    fn workflow(text: &str) -> Workflow {
        crate::workflow::parse("w", ".knotless/workflows/w.yml", text).expect("the workflow")
    }

    fn declaring(images: bool, caches: bool) -> Capabilities {
        Capabilities { images, caches, ..Capabilities::default() }
    }

    fn lease(path: &str) -> CacheLease {
        CacheLease { path: path.into(), base: None, upper: None, max_bytes: 1 << 20, saved: Default::default() }
    }

    /// What `work` returns, and the lines it logged.
    fn logged<T>(work: impl FnOnce(&mut RunLog<'_>) -> T) -> (T, Vec<String>) {
        let mut sink = Lines::default();
        let mut log = RunLog::new(Masker::new(Vec::<String>::new()).expect("a masker"), &mut sink);
        let done = work(&mut log);
        drop(log);
        (done, sink.0)
    }

    #[test]
    fn an_executor_that_takes_no_images_is_sent_none_and_the_log_names_the_image() {
        let named = workflow("image: rust:1.95\nsteps:\n  - name: s\n    run: true\n");
        let (image, lines) = logged(|log| start_image(&named, Some(&declaring(false, true)), "shell", log));
        assert_eq!(image, None);
        assert_eq!(lines, ["image rust:1.95 ignored: executor shell does not take images (it declares images: false)"]);

        let (image, lines) = logged(|log| start_image(&named, Some(&declaring(true, true)), "docker", log));
        assert_eq!(image.as_deref(), Some("rust:1.95"));
        assert!(lines.is_empty(), "{lines:?}");

        let unnamed = workflow("steps:\n  - name: s\n    run: true\n");
        let (image, lines) = logged(|log| start_image(&unnamed, Some(&declaring(false, true)), "shell", log));
        assert_eq!(image, None);
        assert!(lines.is_empty(), "nothing to ignore: {lines:?}");
    }

    #[test]
    fn an_executor_that_declares_no_caches_is_given_none_and_the_log_says_so_once() {
        let leases = [lease("target"), lease("/cache")];
        let (usable, lines) = logged(|log| usable_caches(&leases, Some(&declaring(true, false)), "fake", log).len());
        assert_eq!(usable, 0);
        assert_eq!(lines, ["caches: not supported by executor fake (it declares caches: false)"]);

        let (usable, lines) = logged(|log| usable_caches(&leases, Some(&declaring(true, true)), "fake", log).len());
        assert_eq!(usable, 2);
        assert!(lines.is_empty(), "{lines:?}");

        let (usable, lines) = logged(|log| usable_caches(&[], Some(&declaring(true, false)), "fake", log).len());
        assert_eq!(usable, 0);
        assert!(lines.is_empty(), "a run without caches says nothing of them: {lines:?}");
    }
}
