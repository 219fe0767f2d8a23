//! The live log: a check's masked, capped log file streamed as Server-Sent Events while it
//! grows, and its steps as they start and end, ending with the run.
//!
//! - `lines`: new whole lines, drawn as the page draws them ([`Drawer`]: numbered on from the
//!   page's last line, stdout and stderr told apart, colours as classes of the stylesheet,
//!   every control character escaped), each `{"n": 42, "c": "line err", "s": [["f1", "text"]]}`
//!   with `"step": [NAME, INDEX]` on the note that starts a step. The event's id is the byte
//!   offset read up to, so a reconnecting browser goes on where it was.
//! - `steps`: the rows of the steps table whenever they change ([`StepRow`]).
//! - `end`: the run's final status, once its log is read to the end.
//!
//! A stream that starts at an offset reads the log before it first, without sending it, so its
//! line numbers and colours go on from where the page's stopped.

use std::collections::VecDeque;
use std::io::{Read as _, Seek as _};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::Event;
use futures::Stream;
use serde::Serialize;

use super::log_view::{Drawer, Drawn};
use super::pages::{StepRow, step_rows};
use super::view::View;

/// How often the log file is looked at for new lines.
const POLL: Duration = Duration::from_millis(100);
/// The most bytes read for one event.
const CHUNK: usize = 256 << 10;

/// Where a stream is.
struct Follow {
    view: Arc<View>,
    key: String,
    run_id: String,
    log: PathBuf,
    offset: u64,
    /// Made at the first look, once the record's steps are known.
    drawer: Option<Drawer>,
    /// The steps last sent.
    rows: Option<Vec<StepRow>>,
    /// Events found and not yet sent.
    queue: VecDeque<Event>,
    ended: bool,
}

/// A line as the stream sends it.
#[derive(Serialize)]
struct LineOut {
    n: usize,
    c: &'static str,
    s: Vec<(String, String)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<(String, usize)>,
}

impl From<Drawn> for LineOut {
    fn from(drawn: Drawn) -> LineOut {
        LineOut {
            n: drawn.number,
            c: drawn.kind.class(),
            s: drawn.runs.into_iter().map(|(style, text)| (style.classes(), text)).collect(),
            step: drawn.starts.map(|(name, index)| (name, index.saturating_sub(1))),
        }
    }
}

/// At most `limit` bytes of `path` from `offset`.
fn read_from(path: &PathBuf, offset: u64, limit: u64) -> Vec<u8> {
    let mut bytes = Vec::new();
    if let Ok(mut file) = std::fs::File::open(path)
        && file.seek(std::io::SeekFrom::Start(offset)).is_ok()
    {
        let _ = file.take(limit).read_to_end(&mut bytes);
    }
    bytes
}

/// Looks at the record and the log once, and queues what changed: the steps, new whole lines,
/// and (once the run is final and its log read to the end) the end with the run's status.
fn look(follow: &mut Follow) {
    // The record first: a final record means its final log is already in place.
    let record = follow.view.check(&follow.key, &follow.run_id);
    let status = record.as_ref().map(|record| record.status);
    let finished = status.is_none_or(|status| status.is_final());
    let drawer = follow.drawer.get_or_insert_with(|| {
        let mut drawer = Drawer::new(record.as_ref().map_or(&[][..], |record| &record.steps));
        // The log's capped, so what comes before the offset is read whole, and drawn unsent.
        let before = read_from(&follow.log, 0, follow.offset);
        drawer.push(&String::from_utf8_lossy(&before), false, |_| {});
        drawer
    });
    if let Some(record) = record.as_ref().filter(|_| !finished) {
        let rows = step_rows(record);
        if follow.rows.as_ref() != Some(&rows) {
            if let Ok(event) = Event::default().event("steps").json_data(&rows) {
                follow.queue.push_back(event);
            }
            follow.rows = Some(rows);
        }
    }
    let bytes = read_from(&follow.log, follow.offset, CHUNK as u64);
    let at_end = finished && bytes.len() < CHUNK;
    let whole =
        if at_end { bytes.len() } else { bytes.iter().rposition(|&byte| byte == b'\n').map_or(0, |end| end + 1) };
    if whole > 0 || at_end {
        follow.offset += whole as u64;
        let mut lines = Vec::new();
        drawer.push(&String::from_utf8_lossy(&bytes[..whole]), at_end, |drawn| lines.push(LineOut::from(drawn)));
        if !lines.is_empty()
            && let Ok(event) = Event::default().event("lines").id(follow.offset.to_string()).json_data(&lines)
        {
            follow.queue.push_back(event);
        }
    }
    if at_end {
        follow.ended = true;
        let word = status.map_or("gone", |status| status.as_str());
        if let Ok(event) = Event::default().event("end").json_data(word) {
            follow.queue.push_back(event);
        }
    }
}

/// The events of a check's log from byte `offset` on.
pub fn events(
    view: Arc<View>,
    key: String,
    run_id: String,
    log: PathBuf,
    offset: u64,
) -> impl Stream<Item = Result<Event, std::convert::Infallible>> {
    let follow =
        Follow { view, key, run_id, log, offset, drawer: None, rows: None, queue: VecDeque::new(), ended: false };
    futures::stream::unfold(follow, |mut follow| async move {
        loop {
            if let Some(event) = follow.queue.pop_front() {
                return Some((Ok(event), follow));
            }
            if follow.ended {
                return None;
            }
            let back = tokio::task::spawn_blocking(move || {
                look(&mut follow);
                follow
            })
            .await
            .ok()?;
            follow = back;
            if follow.queue.is_empty() && !follow.ended {
                tokio::time::sleep(POLL).await;
            }
        }
    })
}
