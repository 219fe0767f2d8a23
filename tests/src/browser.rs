//! Headless Chromium (Debian's `chromium`, which `.ci/run` installs) driven over the DevTools
//! protocol on a pipe, for the status page's tests: open a page, evaluate an expression in it,
//! wait for one to hold, take a screenshot. `--remote-debugging-pipe` speaks JSON messages
//! ended by a NUL byte on file descriptors 3 and 4; a shell wires them to two FIFOs.

use std::fs::File;
use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::DEADLINE;

/// The browser program: `$KNOTLESS_CHROMIUM`, else `chromium` on `PATH`.
pub fn chromium() -> PathBuf {
    if let Some(path) = std::env::var_os("KNOTLESS_CHROMIUM") {
        return PathBuf::from(path);
    }
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join("chromium"))
        .find(|path| path.is_file());
    found.expect("no `chromium` on PATH: install Debian's chromium (apt-get install chromium; .ci/run does)")
}

/// A headless browser with one page open.
pub struct Browser {
    child: Child,
    commands: File,
    replies: mpsc::Receiver<Value>,
    next_id: u64,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts the browser with a window of `width` x `height` and attaches to a new blank page.
    pub fn launch(width: u32, height: u32) -> Browser {
        let profile = tempfile::tempdir().expect("a profile folder");
        let to_browser = profile.path().join("to-browser");
        let from_browser = profile.path().join("from-browser");
        for fifo in [&to_browser, &from_browser] {
            nix::unistd::mkfifo(fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
        }
        let stderr = File::create(profile.path().join("stderr")).expect("the browser's stderr");
        let script = r#"exec "$0" --headless --no-sandbox --disable-gpu --remote-debugging-pipe \
            --user-data-dir="$3" --window-size="$4" --hide-scrollbars --no-first-run \
            --no-default-browser-check --disable-extensions --disable-background-networking \
            --disable-sync --disable-dev-shm-usage --mute-audio --password-store=basic \
            about:blank 3<"$1" 4>"$2""#;
        let child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg(chromium())
            .arg(&to_browser)
            .arg(&from_browser)
            .arg(profile.path().join("profile"))
            .arg(format!("{width},{height}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .process_group(0)
            .spawn()
            .expect("spawn chromium");
        // The shell opens its ends in order; so do we, on a thread, so a browser that never
        // starts fails the test at the deadline instead of hanging it.
        let (opened, open) = mpsc::channel();
        std::thread::spawn(move || {
            let ends = File::options()
                .write(true)
                .open(&to_browser)
                .and_then(|commands| Ok((commands, File::open(&from_browser)?)));
            let _ = opened.send(ends);
        });
        let (commands, events) = open.recv_timeout(DEADLINE).expect("the browser's pipes").expect("open the pipes");
        let (reply, replies) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(events);
            let mut message = Vec::new();
            while reader.read_until(0, &mut message).is_ok_and(|read| read > 0) {
                message.pop_if(|byte| *byte == 0);
                if let Ok(value) = serde_json::from_slice::<Value>(&message)
                    && value.get("id").is_some()
                    && reply.send(value).is_err()
                {
                    return;
                }
                message.clear();
            }
        });
        let mut browser = Browser { child, commands, replies, next_id: 0, session: String::new(), _profile: profile };
        let target = browser.send(None, "Target.createTarget", json!({ "url": "about:blank" }));
        let target_id = target["targetId"].as_str().expect("a target id").to_string();
        let attached = browser.send(None, "Target.attachToTarget", json!({ "targetId": target_id, "flatten": true }));
        browser.session = attached["sessionId"].as_str().expect("a session id").to_string();
        browser.page("Page.enable", json!({}));
        browser
    }

    /// Sends a command (to the page's session unless `session` is `None`) and waits for its
    /// result.
    fn send(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = session {
            message["sessionId"] = json!(session);
        }
        let mut bytes = serde_json::to_vec(&message).expect("json");
        bytes.push(0);
        self.commands.write_all(&bytes).expect("write to the browser");
        let started = Instant::now();
        loop {
            let left = DEADLINE.checked_sub(started.elapsed()).expect("the browser answers in time");
            let reply = self.replies.recv_timeout(left).unwrap_or_else(|_| panic!("no answer to {method}"));
            if reply["id"] == id {
                assert!(reply.get("error").is_none(), "{method}: {reply}");
                return reply["result"].clone();
            }
        }
    }

    fn page(&mut self, method: &str, params: Value) -> Value {
        let session = self.session.clone();
        self.send(Some(&session), method, params)
    }

    /// Runs `source` in every document before its own scripts (to record `alert` calls, say).
    pub fn before_each_document(&mut self, source: &str) {
        self.page("Page.addScriptToEvaluateOnNewDocument", json!({ "source": source }));
    }

    /// Opens `url` and waits until its document has loaded (images included).
    pub fn open(&mut self, url: &str) {
        self.page("Page.navigate", json!({ "url": url }));
        let expected = serde_json::to_string(url).expect("json");
        self.wait_for(
            &format!("{url} to load"),
            &format!("location.href === {expected} && document.readyState === 'complete'"),
        );
    }

    /// The value of a JavaScript expression in the page.
    pub fn eval(&mut self, expression: &str) -> Value {
        let result = self
            .page("Runtime.evaluate", json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }));
        assert!(result.get("exceptionDetails").is_none(), "{expression}: {result}");
        result["result"]["value"].clone()
    }

    /// Polls `expression` until it is truthy, with the deadline, and returns its value.
    pub fn wait_for(&mut self, what: &str, expression: &str) -> Value {
        let started = Instant::now();
        loop {
            let value = self.eval(expression);
            let truthy = match &value {
                Value::Null => false,
                Value::Bool(holds) => *holds,
                Value::Number(number) => number.as_f64() != Some(0.0),
                Value::String(text) => !text.is_empty(),
                _ => true,
            };
            if truthy {
                return value;
            }
            assert!(started.elapsed() < DEADLINE, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Lays pages out as in a window of `width` x `height` CSS pixels (a phone's, say).
    pub fn resize(&mut self, width: u32, height: u32) {
        let metrics = json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": false });
        self.page("Emulation.setDeviceMetricsOverride", metrics);
    }

    /// Saves a PNG screenshot of the whole page at `path`.
    pub fn screenshot(&mut self, path: &Path) {
        use base64::Engine as _;
        let shot = self.page("Page.captureScreenshot", json!({ "format": "png", "captureBeyondViewport": true }));
        let data = shot["data"].as_str().expect("screenshot data");
        let bytes = base64::engine::general_purpose::STANDARD.decode(data).expect("base64");
        std::fs::create_dir_all(path.parent().expect("a folder")).expect("create the screenshots folder");
        std::fs::write(path, bytes).expect("write the screenshot");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

/// An RGB PNG of `width` x `height` (stored, uncompressed) whose pixels `color` gives.
pub fn png(width: u32, height: u32, color: impl Fn(u32, u32) -> [u8; 3]) -> Vec<u8> {
    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &byte in bytes {
            crc ^= u32::from(byte);
            for _ in 0..8 {
                crc = if crc & 1 == 1 { (crc >> 1) ^ 0xedb8_8320 } else { crc >> 1 };
            }
        }
        !crc
    }
    fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let start = out.len();
        out.extend_from_slice(kind);
        out.extend_from_slice(data);
        let crc = crc32(&out[start..]);
        out.extend_from_slice(&crc.to_be_bytes());
    }
    let mut raw = Vec::new();
    for y in 0..height {
        raw.push(0);
        for x in 0..width {
            raw.extend_from_slice(&color(x, y));
        }
    }
    // zlib with stored deflate blocks, and its Adler-32.
    let mut zlib = vec![0x78, 0x01];
    let blocks: Vec<&[u8]> = raw.chunks(65_535).collect();
    for (index, block) in blocks.iter().enumerate() {
        zlib.push(u8::from(index + 1 == blocks.len()));
        let length = block.len() as u16;
        zlib.extend_from_slice(&length.to_le_bytes());
        zlib.extend_from_slice(&(!length).to_le_bytes());
        zlib.extend_from_slice(block);
    }
    let (mut a, mut b) = (1u32, 0u32);
    for &byte in &raw {
        a = (a + u32::from(byte)) % 65_521;
        b = (b + a) % 65_521;
    }
    zlib.extend_from_slice(&((b << 16) | a).to_be_bytes());
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut header = Vec::new();
    header.extend_from_slice(&width.to_be_bytes());
    header.extend_from_slice(&height.to_be_bytes());
    header.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(&mut out, b"IHDR", &header);
    chunk(&mut out, b"IDAT", &zlib);
    chunk(&mut out, b"IEND", &[]);
    out
}
