//! `upload` and `download`: tar streams on the side channel, unpacked into and packed from
//! paths inside a session with the protocol crate's vetted tar functions.

use std::io::Write;

use knotless_protocol::sdk::{Context, DownloadStream, UploadStream};
use knotless_protocol::tarball::{self, UnpackError};
use knotless_protocol::*;
use tokio_util::io::SyncIoBridge;

use crate::ShellExecutor;

/// `upload`: unpacks the whole stream at `params.path`, created if missing.
pub async fn upload(
    executor: &ShellExecutor,
    params: &TransferParams,
    data: UploadStream,
    _context: Context,
) -> Result<(), ExecutorError> {
    let session = executor.sessions.get(&params.session)?;
    let dest = session.resolve(&params.path)?;
    let max_bytes = params.max_bytes;
    let bridge = SyncIoBridge::new(data);
    let shown = dest.display().to_string();
    let unpacked = tokio::task::spawn_blocking(move || tarball::unpack_vetted(bridge, &dest, max_bytes))
        .await
        .map_err(|error| ExecutorError::infrastructure(format!("the upload into {shown} failed: {error}")))?;
    match unpacked {
        Ok(unpacked) => {
            tracing::debug!(session = %session.id, path = %shown, bytes = unpacked.bytes, entries = unpacked.entries, "uploaded");
            Ok(())
        }
        Err(error @ (UnpackError::Refused { .. } | UnpackError::TooLarge { .. })) => {
            Err(ExecutorError::new(ErrorKind::TooLarge, format!("cannot upload into {shown}: {error}")))
        }
        Err(UnpackError::Io(error)) => {
            Err(ExecutorError::infrastructure(format!("cannot upload into {shown}: {error}")))
        }
    }
}

/// `download`: packs the contents of `params.path`; a missing path is `NOT_FOUND`.
pub async fn download(
    executor: &ShellExecutor,
    params: &TransferParams,
    data: DownloadStream,
    context: Context,
) -> Result<(), ExecutorError> {
    let session = executor.sessions.get(&params.session)?;
    let source = session.resolve(&params.path)?;
    let shown = source.display().to_string();
    match tokio::fs::metadata(&source).await {
        Ok(metadata) if metadata.is_dir() => {}
        Ok(_) => {
            return Err(ExecutorError::configuration(format!("cannot download {shown}: not a folder")));
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Err(ExecutorError::new(
                ErrorKind::NotFound,
                format!("no path {} in session {}", params.path, session.id),
            ));
        }
        Err(error) => {
            return Err(ExecutorError::infrastructure(format!("cannot read {shown}: {error}")));
        }
    }
    let bridge = SyncIoBridge::new(data);
    let packed = tokio::task::spawn_blocking(move || -> std::io::Result<Vec<tarball::Skipped>> {
        let (mut bridge, skipped) = tarball::pack_dir_skipping(&source, bridge)?;
        bridge.flush()?;
        bridge.shutdown()?;
        Ok(skipped)
    })
    .await
    .map_err(|error| ExecutorError::infrastructure(format!("the download of {shown} failed: {error}")))?;
    let skipped = packed.map_err(|error| ExecutorError::infrastructure(format!("cannot download {shown}: {error}")))?;
    for entry in skipped {
        context.left_out(&session.id, &params.path, &entry.path.display().to_string(), entry.reason).await;
    }
    tracing::debug!(session = %session.id, path = %shown, "downloaded");
    Ok(())
}
