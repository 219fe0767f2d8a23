//! A run's NetworkPolicy, whose life is its run's: created before the run's Job (so its pod
//! never runs a moment without it), then given the run's pod as its owner as soon as the pod
//! exists, so that the garbage collector deletes it once the pod is gone, however the run
//! ends (`stop`, the Job's TTL or deadline, a kill of the executor). It is owned by the pod,
//! not the Job: the Job's deletion deletes all its dependents at once, a policy among them
//! while the pod still terminates. The executor deletes it itself only when no pod ever owned
//! it (its Job never made one), and the orphan sweep takes those a killed executor left
//! (`cleanup.rs`).

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use knotless_protocol::ExecutorError;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::core::Status;

use crate::api::Client;
use crate::manifest::{self, JobSpecInput, PodOwner};

/// The NetworkPolicy of a run that is starting.
#[derive(Debug)]
pub struct RunPolicy {
    /// Its name.
    pub name: String,
    namespace: String,
    /// The pods that own it, as given to the API.
    owners: Vec<PodOwner>,
}

impl RunPolicy {
    /// Creates the run's default-deny-ingress policy (`fieldValidation=Strict`); one of the
    /// same name is an error, as a Job of the same name is.
    pub async fn create(client: &Client, input: &JobSpecInput) -> Result<RunPolicy, ExecutorError> {
        let object = manifest::network_policy(input);
        let name = object.metadata.name.clone().unwrap_or_default();
        let what = format!("create the NetworkPolicy {name}");
        if client.create::<NetworkPolicy>(&input.namespace, &object, &what).await?.is_none() {
            return Err(ExecutorError::configuration(format!("{what}: a NetworkPolicy of that name exists already")));
        }
        Ok(RunPolicy { name, namespace: input.namespace.clone(), owners: Vec::new() })
    }

    /// Makes `pod` an owner of the policy, unless it is one already: one merge patch of its
    /// `ownerReferences` (every pod that owned it, so the garbage collector waits for all).
    pub async fn owned_by(&mut self, client: &Client, pod: &Pod) -> Result<(), ExecutorError> {
        let (Some(name), Some(uid)) = (pod.metadata.name.clone(), pod.metadata.uid.clone()) else {
            return Ok(());
        };
        if self.owners.iter().any(|owner| owner.uid == uid) {
            return Ok(());
        }
        let mut owners = self.owners.clone();
        owners.push(PodOwner { name, uid });
        let api: Api<NetworkPolicy> = client.api(&self.namespace);
        let patch = manifest::owned_by(&owners);
        let what = format!("give the NetworkPolicy {} its pod as owner", self.name);
        client.limited(&what, api.patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))).await?;
        tracing::debug!(policy = %self.name, pods = owners.len(), "network policy owned by the run's pod");
        self.owners = owners;
        Ok(())
    }

    /// Whether a pod owns it (the garbage collector deletes it after the pod).
    pub fn owned(&self) -> bool {
        !self.owners.is_empty()
    }

    /// After a start that failed with its pod gone (or never made): deletes the policy if no
    /// pod owns it; one that a pod owns is the garbage collector's.
    pub async fn delete_unowned(&self, client: &Client) -> Result<(), ExecutorError> {
        if self.owned() {
            return Ok(());
        }
        let api: Api<NetworkPolicy> = client.api(&self.namespace);
        let what = format!("delete the NetworkPolicy {}", self.name);
        client.unless(&what, api.delete(&self.name, &DeleteParams::default()), Status::is_not_found).await?;
        tracing::info!(policy = %self.name, namespace = %self.namespace, "network policy deleted");
        Ok(())
    }
}
