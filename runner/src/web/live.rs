//! The live log: a check's masked, capped log file streamed as Server-Sent Events while it
//! grows, whole lines at a time with control characters escaped, from a byte offset (the event
//! id, so a reconnecting browser goes on where it was), ending with the run.

use std::io::{Read as _, Seek as _};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::Event;
use futures::Stream;

use super::view::View;
use crate::printable;

/// How often the log file is looked at for new lines.
const POLL: Duration = Duration::from_millis(100);
/// The most bytes sent in one event.
const CHUNK: usize = 256 << 10;

/// Where a stream is.
struct Follow {
    view: Arc<View>,
    key: String,
    run_id: String,
    log: PathBuf,
    offset: u64,
    ended: bool,
}

/// The bytes of `path` from `offset`, at most [`CHUNK`].
fn read_from(path: &PathBuf, offset: u64) -> Vec<u8> {
    let mut bytes = Vec::new();
    if let Ok(mut file) = std::fs::File::open(path)
        && file.seek(std::io::SeekFrom::Start(offset)).is_ok()
    {
        let _ = file.take(CHUNK as u64).read_to_end(&mut bytes);
    }
    bytes
}

/// What the next event is, when there is one now: new whole lines, or (once the run is final
/// and its log read to the end) the end with the run's status.
fn step(follow: &mut Follow) -> Option<Event> {
    // The record first: a final record means its final log is already in place.
    let status = follow.view.check(&follow.key, &follow.run_id).map(|record| record.status);
    let finished = status.is_none_or(|status| status.is_final());
    let bytes = read_from(&follow.log, follow.offset);
    let whole = if finished && bytes.len() < CHUNK {
        bytes.len()
    } else {
        bytes.iter().rposition(|&byte| byte == b'\n').map_or(0, |end| end + 1)
    };
    if whole > 0 {
        follow.offset += whole as u64;
        let text = printable::log(&bytes[..whole]);
        return Event::default().event("lines").id(follow.offset.to_string()).json_data(text).ok();
    }
    if finished {
        follow.ended = true;
        let word = status.map_or("gone", |status| status.as_str());
        return Event::default().event("end").json_data(word).ok();
    }
    None
}

/// The events of a check's log from byte `offset` on.
pub fn events(
    view: Arc<View>,
    key: String,
    run_id: String,
    log: PathBuf,
    offset: u64,
) -> impl Stream<Item = Result<Event, std::convert::Infallible>> {
    let follow = Follow { view, key, run_id, log, offset, ended: false };
    futures::stream::unfold(follow, |mut follow| async move {
        if follow.ended {
            return None;
        }
        loop {
            let (next, back) = tokio::task::spawn_blocking(move || {
                let next = step(&mut follow);
                (next, follow)
            })
            .await
            .ok()?;
            follow = back;
            if let Some(event) = next {
                return Some((Ok(event), follow));
            }
            tokio::time::sleep(POLL).await;
        }
    })
}
