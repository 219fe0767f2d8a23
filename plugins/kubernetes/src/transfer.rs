//! `upload` and `download`: tar streams between the side channel and `kubectl exec -i` of
//! `tar x` / `tar c` in the pod, which keeps modes, symlinks, executable bits and empty
//! folders; every uploaded entry is vetted on its way
//! ([`knotless_protocol::tarball::copy_vetted`]). The SDK bounds the bytes and the deadline; a
//! missing folder is `NOT_FOUND`.

use std::process::Stdio;

use knotless_protocol::sdk::remote;
use knotless_protocol::sdk::{Context, DownloadStream, UploadStream};
use knotless_protocol::*;
use tokio::io::AsyncWriteExt;

use crate::KubernetesExecutor;
use crate::kubectl::{self, Kubectl};
use crate::session::{CALL_LIMIT, Session};

/// The exit code of the download script when the folder is missing.
const MISSING: i32 = 66;

/// Unpacks stdin into `$1`, created first.
pub const UNPACK: &str = "mkdir -p -- \"$1\" && exec tar -x -p -f - -C \"$1\"";

/// Packs the contents of `$1` to stdout, or exits 66 when it is no folder.
pub const PACK: &str = "[ -d \"$1\" ] || { echo \"no folder $1\" >&2; exit 66; }; exec tar -c -f - -C \"$1\" .";

/// The argv of an upload into `path`.
pub fn upload_args(pod: &str, path: &str) -> Vec<String> {
    kubectl::exec_args(pod, &["sh", "-c", UNPACK, "sh", path])
}

/// The argv of a download of `path`.
pub fn download_args(pod: &str, path: &str) -> Vec<String> {
    kubectl::exec_args(pod, &["sh", "-c", PACK, "sh", path])
}

fn absolute(path: &str) -> Result<String, ExecutorError> {
    if path.starts_with('/') && !path.split('/').any(|part| part == "..") {
        Ok(path.to_string())
    } else {
        Err(ExecutorError::configuration(format!("the path {path:?} must be absolute, without `..`")))
    }
}

/// `upload`.
pub async fn upload(
    executor: &KubernetesExecutor,
    params: &TransferParams,
    data: UploadStream,
    _context: Context,
) -> Result<(), ExecutorError> {
    let kubectl = executor.kubectl()?;
    let session = executor.session(&params.session)?;
    let path = absolute(&params.path)?;
    // Unpacked into a staging folder inside the destination, merged in only once whole.
    let staging = remote::staging_path(&path)?;
    let unpacked = unpack(&kubectl, &session, &staging, &path, data).await;
    let finish = match &unpacked {
        Ok(()) => remote::merge_argv(&staging, &path),
        Err(_) => remote::discard_argv(&staging),
    };
    let finish: Vec<&str> = finish.iter().map(String::as_str).collect();
    if let Err(error) = kubectl.ok(&kubectl::exec_args(&session.pod, &finish), None, CALL_LIMIT).await {
        let error = ExecutorError::infrastructure(format!("cannot finish the upload into {path}: {}", error.message));
        return unpacked.and(Err(error));
    }
    unpacked?;
    tracing::info!(job = %session.job, namespace = %session.namespace, path = %path, "uploaded");
    Ok(())
}

/// `tar x` of the vetted stream into the folder `staging` in the pod.
async fn unpack(
    kubectl: &Kubectl,
    session: &Session,
    staging: &str,
    path: &str,
    data: UploadStream,
) -> Result<(), ExecutorError> {
    let mut command = kubectl.command(&upload_args(&session.pod, staging));
    command.stdin(Stdio::piped());
    let mut child = command
        .spawn()
        .map_err(|error| ExecutorError::infrastructure(format!("cannot run kubectl exec to upload {path}: {error}")))?;
    let stdin = child.stdin.take().ok_or_else(|| ExecutorError::infrastructure("kubectl exec has no stdin"))?;
    // Entries are vetted on their way: `tar x` in the pod would unpack device nodes and `..`.
    let (fed, output) = tokio::join!(remote::feed_vetted(data, stdin, path), child.wait_with_output());
    let output =
        output.map_err(|error| ExecutorError::infrastructure(format!("kubectl exec to upload {path}: {error}")))?;
    let stderr = String::from_utf8_lossy(&output.stderr).trim().replace('\n', " | ");
    fed.map_err(|error| match error.kind {
        ErrorKind::Infrastructure => ExecutorError::infrastructure(format!("{}; {stderr}", error.message)),
        _ => error,
    })?;
    if !output.status.success() {
        return Err(ExecutorError::infrastructure(format!(
            "cannot unpack into {path} in pod {}: {stderr}",
            session.pod
        )));
    }
    Ok(())
}

/// `download`.
pub async fn download(
    executor: &KubernetesExecutor,
    params: &TransferParams,
    mut data: DownloadStream,
    _context: Context,
) -> Result<(), ExecutorError> {
    let kubectl = executor.kubectl()?;
    let session = executor.session(&params.session)?;
    let path = absolute(&params.path)?;
    let mut child = kubectl.command(&download_args(&session.pod, &path)).spawn().map_err(|error| {
        ExecutorError::infrastructure(format!("cannot run kubectl exec to download {path}: {error}"))
    })?;
    let mut stdout = child.stdout.take().ok_or_else(|| ExecutorError::infrastructure("kubectl exec has no stdout"))?;
    let mut stderr = child.stderr.take().ok_or_else(|| ExecutorError::infrastructure("kubectl exec has no stderr"))?;
    let mut said = Vec::new();
    let (copied, _) = tokio::join!(tokio::io::copy(&mut stdout, &mut data), stderr.read_to_end(&mut said));
    if copied.is_err() {
        let _ = child.start_kill();
    }
    let status = child
        .wait()
        .await
        .map_err(|error| ExecutorError::infrastructure(format!("kubectl exec to download {path}: {error}")))?;
    let said = String::from_utf8_lossy(&said).trim().replace('\n', " | ");
    if status.code() == Some(MISSING) {
        return Err(ExecutorError::new(ErrorKind::NotFound, format!("no path {path} in session {}", session.id)));
    }
    if let Err(error) = copied {
        return Err(ExecutorError::infrastructure(format!("the download of {path} failed: {error}")));
    }
    if !status.success() {
        return Err(ExecutorError::infrastructure(format!("cannot pack {path} in pod {}: {said}", session.pod)));
    }
    data.shutdown()
        .await
        .map_err(|error| ExecutorError::infrastructure(format!("the download of {path} did not end: {error}")))?;
    tracing::info!(job = %session.job, namespace = %session.namespace, path = %path, "downloaded");
    Ok(())
}

use tokio::io::AsyncReadExt as _;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfer_argv_keeps_the_path_out_of_the_script() {
        let args = download_args("p", "/work/a b");
        assert_eq!(args.last().map(String::as_str), Some("/work/a b"));
        assert!(!args[8].contains("/work/a b"));
        assert!(absolute("relative").is_err() && absolute("/a/../b").is_err());
    }
}
