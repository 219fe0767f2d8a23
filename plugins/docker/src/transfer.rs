//! `upload` and `download`: tar streams between the side channel and `docker cp`.
//!
//! An upload goes into a staging folder inside its destination first and is merged in only once
//! whole, so a refused one leaves nothing behind; every entry is vetted on its way
//! ([`knotless_protocol::tarball::copy_vetted`]). When the image has a `tar` (found at `start`),
//! that is one `docker exec -i … sh -c` that makes the staging folder, unpacks stdin into it
//! with `tar x`, keeping modes, symlinks and empty folders, not owners, and merges it in only
//! when the stream ended with the seal the executor adds once the whole upload was read and
//! vetted ([`knotless_protocol::sdk::remote::UNPACK_SEALED`]): a refused, broken or cut stream
//! has no seal and is removed. Without a `tar`, it is three calls: a `docker exec` makes the
//! staging folder, `docker cp - <container>:<folder>` unpacks into it (owned by the container's
//! root) and another `docker exec` merges it in ([`knotless_protocol::sdk::remote::MERGE`]).
//! `docker cp <container>:<folder>/. -` packs the folder's contents with entries relative to
//! it (`./a/b`), which is what the protocol's download carries, less what no archive the runner
//! accepts may hold (special files, links that leave the folder): those are left out, each named
//! in a warning ([`knotless_protocol::sdk::remote::pass_download`]). The SDK counts the bytes and
//! enforces the bound; the deadline drops these futures, and every child is killed on drop.

use knotless_protocol::sdk::remote;
use knotless_protocol::sdk::{Context, DownloadStream, UploadStream};
use knotless_protocol::*;

use crate::DockerExecutor;
use crate::argv;
use crate::docker::{Docker, Failure, SHORT_CALL, Said, tail};
use crate::session::Session;

/// `upload`: unpacks the whole stream at `params.path`, created if missing: into a staging
/// folder inside it first, merged in only once whole and vetted, so a refused or broken
/// upload leaves the destination as it was.
pub async fn upload(
    executor: &DockerExecutor,
    params: &TransferParams,
    data: UploadStream,
    _context: Context,
) -> Result<(), ExecutorError> {
    let config = executor.config.get()?;
    let session = executor.sessions.get(&params.session)?;
    let path = session.resolve(&params.path)?;
    let docker = &config.docker;
    let staging = remote::staging_path(&path)?;
    if session.tar {
        unpack_sealed(docker, &session, &staging, &path, data).await?;
        tracing::info!(session = %session.id, container = %session.container, %path, "uploaded");
        return Ok(());
    }
    if let Err(failure) = docker.output(&argv::make_folders(&session.container, &[&staging]), SHORT_CALL).await {
        return Err(failed(docker, &session, &format!("cannot create {path} for an upload"), &failure).await);
    }
    let unpacked = copy_in(docker, &session, &staging, &path, data).await;
    let (finish, what) = match &unpacked {
        Ok(()) => (remote::merge_argv(&staging, &path), "cannot move the upload into place"),
        Err(_) => (remote::discard_argv(&staging), "cannot remove a refused upload"),
    };
    if let Err(failure) = docker.output(&argv::exec(&session.container, &finish), SHORT_CALL).await {
        let error = failed(docker, &session, &format!("{what} at {path}"), &failure).await;
        return unpacked.and(Err(error));
    }
    unpacked?;
    tracing::info!(session = %session.id, container = %session.container, %path, "uploaded");
    Ok(())
}

/// One `docker exec -i` of [`remote::UNPACK_SEALED`]: the vetted, sealed stream unpacked into
/// `staging` and merged into `path`.
async fn unpack_sealed(
    docker: &Docker,
    session: &Session,
    staging: &str,
    path: &str,
    data: UploadStream,
) -> Result<(), ExecutorError> {
    let seal = remote::seal_name()?;
    let command = remote::unpack_sealed_argv(staging, path, &seal);
    let mut child =
        docker.command(&argv::exec(&session.container, &command)).stdin(std::process::Stdio::piped()).spawn().map_err(
            |error| ExecutorError::infrastructure(format!("cannot run the docker CLI for an upload: {error}")),
        )?;
    let Some(stdin) = child.stdin.take() else {
        return Err(ExecutorError::infrastructure("docker exec has no stdin"));
    };
    let (fed, output) =
        tokio::join!(remote::feed_vetted_sealed_pipe(data, stdin, path, &seal), child.wait_with_output());
    let output = output
        .map_err(|error| ExecutorError::infrastructure(format!("cannot wait for the upload into {path}: {error}")))?;
    // A refused entry is the answer, whatever the cut stream made tar say.
    if let Err(refusal) = &fed
        && refusal.kind == ErrorKind::TooLarge
    {
        return fed;
    }
    if !output.status.success() {
        let what = match output.status.code() {
            Some(remote::UNPACK_UNMERGED) => format!("cannot move the upload into place at {path}"),
            _ => format!("cannot upload into {path}"),
        };
        let failure = Failure::Exited { code: output.status.code(), stderr: tail(&output.stderr) };
        return Err(failed(docker, session, &what, &failure).await);
    }
    fed
}

/// `docker cp` of the vetted stream into the folder `staging`.
async fn copy_in(
    docker: &Docker,
    session: &Session,
    staging: &str,
    path: &str,
    data: UploadStream,
) -> Result<(), ExecutorError> {
    let mut child = docker
        .command(&argv::copy_in(&session.container, staging))
        .stdin(std::process::Stdio::piped())
        .spawn()
        .map_err(|error| ExecutorError::infrastructure(format!("cannot run the docker CLI for an upload: {error}")))?;
    let Some(stdin) = child.stdin.take() else {
        return Err(ExecutorError::infrastructure("docker cp has no stdin"));
    };
    // Entries are vetted on their way: docker cp would unpack device nodes and `..` as given.
    let (fed, output) = tokio::join!(remote::feed_vetted_pipe(data, stdin, path), child.wait_with_output());
    let output = output
        .map_err(|error| ExecutorError::infrastructure(format!("cannot wait for docker cp into {path}: {error}")))?;
    fed?;
    if !output.status.success() {
        let failure = Failure::Exited { code: output.status.code(), stderr: tail(&output.stderr) };
        return Err(failed(docker, session, &format!("cannot upload into {path}"), &failure).await);
    }
    Ok(())
}

/// `download`: packs the contents of `params.path`; a missing path is `NOT_FOUND`.
pub async fn download(
    executor: &DockerExecutor,
    params: &TransferParams,
    data: DownloadStream,
    context: Context,
) -> Result<(), ExecutorError> {
    let config = executor.config.get()?;
    let session = executor.sessions.get(&params.session)?;
    let path = session.resolve(&params.path)?;
    let docker = &config.docker;
    let mut child = docker
        .command(&argv::copy_out(&session.container, &path))
        .spawn()
        .map_err(|error| ExecutorError::infrastructure(format!("cannot run the docker CLI for a download: {error}")))?;
    let Some(stdout) = child.stdout.take() else {
        return Err(ExecutorError::infrastructure("docker cp has no stdout"));
    };
    // Special files and links that leave the folder are left out, each named in a warning.
    // Dropping docker's stdout on an error makes it stop at its next write.
    let pump = async move { remote::pass_download(stdout, data).await.1 };
    let (copied, output) = tokio::join!(pump, child.wait_with_output());
    let output = output
        .map_err(|error| ExecutorError::infrastructure(format!("cannot wait for docker cp of {path}: {error}")))?;
    // Over the bound, the side channel refused the rest and docker cp was stopped: say that.
    if let Err(error) = &copied
        && error.kind() == std::io::ErrorKind::FileTooLarge
    {
        return Err(ExecutorError::new(ErrorKind::TooLarge, format!("cannot download {path}: {error}")));
    }
    if !output.status.success() {
        let failure = Failure::Exited { code: output.status.code(), stderr: tail(&output.stderr) };
        if failure.said() == Said::NoPath {
            return Err(ExecutorError::new(
                ErrorKind::NotFound,
                format!("no path {} in session {} (container {})", params.path, session.id, session.container),
            ));
        }
        if failure.said() == Said::NotAFolder {
            return Err(ExecutorError::configuration(format!(
                "cannot download {path} from session {}: not a folder",
                session.id
            )));
        }
        return Err(failed(docker, &session, &format!("cannot download {path}"), &failure).await);
    }
    let skipped =
        copied.map_err(|error| ExecutorError::infrastructure(format!("the download of {path} broke off: {error}")))?;
    for entry in skipped {
        context.left_out(&session.id, &params.path, &entry.path.display().to_string(), entry.reason).await;
    }
    tracing::info!(session = %session.id, container = %session.container, %path, "downloaded");
    Ok(())
}

/// The error of a failed docker call on a session: an infrastructure error, saying so when the
/// container is gone.
async fn failed(docker: &Docker, session: &Session, what: &str, failure: &Failure) -> ExecutorError {
    let gone = failure.no_such_container() || matches!(docker.state(&session.container).await, Ok(None));
    if gone {
        ExecutorError::infrastructure(format!(
            "{what}: container {} of session {} is gone: {failure}",
            session.container, session.id
        ))
    } else {
        ExecutorError::infrastructure(format!("{what} in container {}: {failure}", session.container))
    }
}
