//! `upload` and `download`: tar streams between the side channel and an exec of `tar x` /
//! `tar c` in the pod over the API's websocket, which keeps modes, symlinks, executable bits
//! and empty folders; every uploaded entry is vetted on its way
//! ([`knotless_protocol::tarball::copy_vetted`]), unpacked into a staging folder inside the
//! destination and merged in only once whole and sealed, in one exec
//! ([`knotless_protocol::sdk::remote::UNPACK_SEALED_FRAMED`]: framed, so that it ends inside the
//! stream, on clusters whose exec cannot end stdin too); a download is passed on less what no archive the
//! runner accepts may hold (special files, links that leave the folder), each named in a warning
//! ([`knotless_protocol::sdk::remote::pass_download`]). The exit code comes from the exec's status
//! channel; an unpack also says its own on stdout, which stands in when the Status is lost.
//! The SDK bounds the bytes and the deadline; a missing folder is `NOT_FOUND`.

use knotless_protocol::sdk::remote::{self, Exec};
use knotless_protocol::sdk::{Context, DownloadStream, UploadStream};
use knotless_protocol::*;
use tokio::io::AsyncReadExt as _;

use crate::KubernetesExecutor;
use crate::api::Client;
use crate::manifest::CONTAINER;
use crate::session::Session;

/// The exit code of the download script when the folder is missing.
const MISSING: i32 = 66;

/// How much of an exec's stderr is kept for its error.
const SAID: u64 = 4096;

/// Says the exit code of the command before it on stdout (its `tar x` writes nothing there),
/// which stands in for the exec's Status when the connection breaks after the unpack ended.
const SAY_CODE: &str = "code=$?; echo \"knotless-unpacked $code\"; exit $code";

/// The exit code an unpack said on its stdout.
fn unpacked(stdout: &str) -> Option<i32> {
    stdout.trim().strip_prefix("knotless-unpacked ")?.parse().ok()
}

/// Packs the contents of `$1` to stdout, or exits 66 when it is no folder.
pub const PACK: &str = "[ -d \"$1\" ] || { echo \"no folder $1\" >&2; exit 66; }; exec tar -c -f - -C \"$1\" .";

/// The argv of an upload into `path`, unpacked into `staging` and merged in only when the
/// stream ends with `seal`, in one exec ([`remote::UNPACK_SEALED_FRAMED`]: the exec's stdin is
/// never closed, so the stream comes framed and ends inside itself), its exit code said on
/// stdout too.
pub fn unpack_argv(staging: &str, path: &str, seal: &str) -> Vec<String> {
    let script = format!("(\n{}\n); {SAY_CODE}", remote::UNPACK_SEALED_FRAMED);
    [String::from("sh"), "-c".into(), script, "sh".into(), staging.into(), path.into(), seal.into()].into()
}

/// The argv of a pack of `path`.
pub fn pack_argv(path: &str) -> Vec<String> {
    ["sh", "-c", PACK, "sh", path].into_iter().map(str::to_string).collect()
}

fn absolute(path: &str) -> Result<String, ExecutorError> {
    if path.starts_with('/') && !path.split('/').any(|part| part == "..") {
        Ok(path.to_string())
    } else {
        Err(ExecutorError::configuration(format!("the path {path:?} must be absolute, without `..`")))
    }
}

/// Reads `reader` to its end, keeping its first [`SAID`] bytes as one line of text: a
/// flood is drained, never kept, and never blocks the exec.
async fn said(mut reader: remote::Reader) -> String {
    let mut kept = Vec::new();
    let mut buffer = vec![0u8; 16 * 1024];
    while let Ok(count) = reader.read(&mut buffer).await {
        if count == 0 {
            break;
        }
        let room = (SAID as usize).saturating_sub(kept.len());
        kept.extend_from_slice(&buffer[..count.min(room)]);
    }
    String::from_utf8_lossy(&kept).trim().replace('\n', " | ")
}

/// `upload`.
pub async fn upload(
    executor: &KubernetesExecutor,
    params: &TransferParams,
    data: UploadStream,
    _context: Context,
) -> Result<(), ExecutorError> {
    let session = executor.sessions.get(&params.session)?;
    let client = executor.cluster.get()?.client().await?;
    let path = absolute(&params.path)?;
    let staging = remote::staging_path(&path)?;
    unpack(&client, &session, &staging, &path, data).await?;
    tracing::info!(job = %session.job, namespace = %session.namespace, path = %path, "uploaded");
    Ok(())
}

/// One exec of `tar x` into the folder `staging` in the pod, merged into `path` when whole: a
/// refused, broken or cut stream has no seal, and the pod removes the staging folder itself.
async fn unpack(
    client: &Client,
    session: &Session,
    staging: &str,
    path: &str,
    data: UploadStream,
) -> Result<(), ExecutorError> {
    let seal = remote::seal_name()?;
    let Exec { stdin, stdout, stderr, ended } =
        client.exec(&session.namespace, &session.pod, CONTAINER, unpack_argv(staging, path, &seal), None).await?;
    // Entries are vetted on their way: `tar x` in the pod would unpack device nodes and `..`.
    let (fed, said, out, code) =
        tokio::join!(remote::feed_vetted_sealed_framed(data, stdin, path, &seal), said(stderr), said(stdout), ended);
    // The Status's exit code, or, when the stream ended without one, what the unpack said.
    let code = code.or_else(|| unpacked(&out));
    // A refused entry is the answer, whatever the cut stream made tar say.
    if let Err(refusal) = &fed
        && refusal.kind == ErrorKind::TooLarge
    {
        return fed;
    }
    match (code, fed) {
        (Some(0), Ok(())) => Ok(()),
        (Some(remote::UNPACK_UNMERGED), _) => Err(ExecutorError::infrastructure(format!(
            "cannot move the upload into place at {path} in pod {}: {said}",
            session.pod
        ))),
        // The stream broke off (the runner's side, the bound): that is the cause.
        (_, Err(error)) => Err(ExecutorError::infrastructure(format!("{}; {said}", error.message))),
        (code, Ok(())) => Err(ExecutorError::infrastructure(format!(
            "cannot unpack into {path} in pod {} (exit code {code:?}): {said}",
            session.pod
        ))),
    }
}

/// `download`.
pub async fn download(
    executor: &KubernetesExecutor,
    params: &TransferParams,
    data: DownloadStream,
    context: Context,
) -> Result<(), ExecutorError> {
    let session = executor.sessions.get(&params.session)?;
    let client = executor.cluster.get()?.client().await?;
    let path = absolute(&params.path)?;
    // No exec to a pod known gone, dying or on a node that does not answer (a real API server
    // accepts that exec and fails it only after its kubelet dial times out, 30 s later).
    if let Some(cause) = unreachable(&session) {
        return Err(ExecutorError::infrastructure(format!(
            "cannot download {path} from pod {} of job {}: {cause}",
            session.pod, session.job
        )));
    }
    let status = std::sync::Arc::new(std::sync::Mutex::new(None));
    let status_of = Some(std::sync::Arc::clone(&status));
    let Exec { stdin, stdout, stderr, ended } =
        client.exec_without_stdin(&session.namespace, &session.pod, CONTAINER, pack_argv(&path), status_of).await?;
    drop(stdin);
    // Special files and links that leave the folder are left out, each named in a warning.
    let copy = async {
        let (rest, copied) = remote::pass_download(stdout, data).await;
        if copied.is_err()
            && let Some(mut rest) = rest
        {
            // A refused download: the rest is read and dropped, so the exec reaches its end
            // (its websocket task waits for a reader while its buffer is full).
            let _ = tokio::io::copy(&mut rest, &mut tokio::io::sink()).await;
        }
        copied
    };
    let (copied, said, code) = tokio::join!(copy, said(stderr), ended);
    if code == Some(MISSING) {
        return Err(ExecutorError::new(ErrorKind::NotFound, format!("no path {path} in session {}", session.id)));
    }
    let skipped = match copied {
        Ok(skipped) => skipped,
        Err(error) => return Err(ExecutorError::infrastructure(format!("the download of {path} failed: {error}"))),
    };
    match code {
        Some(0) => {}
        Some(code) => {
            return Err(ExecutorError::infrastructure(format!(
                "cannot pack {path} in pod {} (exit code {code}): {said}",
                session.pod
            )));
        }
        None => {
            let ended = knotless_protocol::sdk::lock(&status).take();
            let ended = ended.unwrap_or_else(|| "the exec stream ended without a status".to_string());
            let cause = unreachable(&session).map(|cause| format!("; {cause}")).unwrap_or_default();
            let said = if said.is_empty() { String::new() } else { format!("; it said: {said}") };
            return Err(ExecutorError::infrastructure(format!(
                "cannot pack {path} in pod {}: {ended}{cause}{said}",
                session.pod
            )));
        }
    }
    for entry in skipped {
        context.left_out(&session.id, &params.path, &entry.path.display().to_string(), entry.reason).await;
    }
    tracing::info!(job = %session.job, namespace = %session.namespace, path = %path, "downloaded");
    Ok(())
}

/// Why no exec can reach the session's pod, as its watch last saw it: gone, being deleted,
/// ended, or not Ready (its node stopped answering).
fn unreachable(session: &Session) -> Option<String> {
    let seen = session.pods.seen.borrow();
    if seen.deleted {
        return Some("the pod is gone (its job was deleted, or its node lost)".to_string());
    }
    seen.pod.as_ref().and_then(crate::pod::broken)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unpack_says_its_exit_code_on_stdout() {
        assert_eq!(unpacked("knotless-unpacked 0\n"), Some(0));
        assert_eq!(unpacked("knotless-unpacked 2"), Some(2));
        assert_eq!(unpacked("knotless-unpa"), None);
        assert_eq!(unpacked(""), None);
    }

    #[test]
    fn transfer_argv_keeps_the_path_out_of_the_script() {
        let args = pack_argv("/work/a b");
        assert_eq!(args.last().map(String::as_str), Some("/work/a b"));
        assert!(!args[2].contains("/work/a b"));
        assert!(absolute("relative").is_err() && absolute("/a/../b").is_err());
    }
}
