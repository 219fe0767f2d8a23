use super::*;
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::symlink;

/// This host as a step's environment, whose exec delivers stdout `delay` late, as a busy
/// API server or engine may deliver one stream after the other.
struct SlowStdout {
    delay: &'static str,
}

impl Shell for SlowStdout {
    async fn exec(&self, argv: Vec<String>) -> Result<Exec, ExecutorError> {
        let argv: Vec<String> = argv.iter().map(|arg| payload::quote(arg)).collect();
        let command = format!("{} | {{ sleep {}; cat; }}", argv.join(" "), self.delay);
        let child = tokio::process::Command::new("sh")
            .args(["-c", &command])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|error| ExecutorError::infrastructure(error.to_string()))?;
        Exec::from_child(child, "sh")
    }

    async fn lost(&self, step: &str, _: Option<i32>, _: &[u8]) -> ExecutorError {
        ExecutorError::infrastructure(format!("lost the stream of step {step}"))
    }

    async fn end_environment(&self, _: &str) {}

    fn describe(&self) -> String {
        "this host".to_string()
    }
}

#[tokio::test]
async fn output_that_comes_after_the_exit_code_is_the_steps_all_the_same() {
    let (frames, mut sent) = tokio::sync::mpsc::channel(64);
    let context = Context {
        cancel: tokio_util::sync::CancellationToken::new(),
        notifier: crate::sdk::Notifier { frames },
        received: Instant::now(),
        left_out: Default::default(),
    };
    let params = CommandParams {
        session: "s".into(),
        step: 0,
        name: "late".into(),
        script: "echo first; echo last".into(),
        env: BTreeMap::new(),
        secrets: BTreeMap::new(),
        workdir: None,
        timeout_ms: 30_000,
    };
    let workdir = std::env::temp_dir();
    let shell = SlowStdout { delay: "1" };
    let result = run_step(&shell, &params, &workdir.to_string_lossy(), &context).await.expect("a result");
    assert_eq!(result.exit_code, 0);
    drop(context);
    let mut stdout = Vec::new();
    while let Some(frame) = sent.recv().await {
        let frame: serde_json::Value = serde_json::from_slice(&frame).expect("a frame");
        if frame["params"]["stream"] == "stdout" {
            let data = frame["params"]["data"].as_str().unwrap_or_default();
            stdout.extend(base64_simd::STANDARD.decode_to_vec(data).expect("base64"));
        }
    }
    assert_eq!(String::from_utf8_lossy(&stdout), "first\nlast\n", "every line the step wrote");
}

#[test]
fn a_limit_is_at_its_end_within_five_percent_and_near_it_from_three_quarters() {
    let usage = |used| Usage { limit_name: "pids", used, limit: 1024, refused: None };
    assert!(usage(1024).at_the_limit() && usage(973).at_the_limit());
    assert!(!usage(972).at_the_limit() && !usage(3).at_the_limit());
    assert!(usage(768).near_the_limit() && !usage(767).near_the_limit());
    let small = |used| Usage { limit_name: "pids", used, limit: 16, refused: None };
    assert!(small(14).at_the_limit() && !small(13).at_the_limit());
    assert_eq!(usage(1000).exhausted(), "exhausted its pids limit of 1024 (1000 in use)");
}

#[test]
fn a_limit_that_refused_a_process_is_exhausted_however_many_are_left() {
    let usage = |used, refused| Usage { limit_name: "pids", used, limit: 1024, refused: Some(refused) };
    // Processes that exhaust a limit die as their forks fail: a count of what is in use
    // may come at any point between a few and the limit.
    assert!(usage(300, 1).at_the_limit() && usage(300, 1).near_the_limit());
    assert!(usage(1, 40).at_the_limit());
    // Never refused, a count at the limit is only many processes.
    assert!(!usage(1024, 0).at_the_limit() && !usage(1000, 0).near_the_limit());
}

#[test]
fn a_staged_upload_merges_in_and_never_through_a_link() {
    let outside = tempfile::tempdir().expect("tempdir");
    let dest = tempfile::tempdir().expect("tempdir");
    let root = dest.path();
    fs::create_dir(root.join("sub")).expect("mkdir");
    fs::write(root.join("sub/old"), "old").expect("write");
    fs::write(root.join("file"), "before").expect("write");
    symlink(outside.path(), root.join("escape")).expect("symlink");
    let staging = staging_path(&root.to_string_lossy()).expect("staging");
    let staged = std::path::Path::new(&staging);
    fs::create_dir_all(staged.join("sub")).expect("mkdir");
    fs::create_dir_all(staged.join("escape")).expect("mkdir");
    fs::write(staged.join("sub/new"), "new").expect("write");
    fs::write(staged.join("escape/planted"), "planted").expect("write");
    fs::write(staged.join("file"), "after").expect("write");
    fs::write(staged.join(".hidden"), "hidden").expect("write");
    // Names a shell or mv could take for something else, moved together into a new folder.
    let odd = ["-rf", "a b", "new\nline", "..dots", "*", "$(x)"];
    fs::create_dir(staged.join("fresh")).expect("mkdir");
    for name in odd {
        fs::write(staged.join("fresh").join(name), name).expect("write");
    }
    fs::create_dir(root.join("fresh")).expect("mkdir");
    let argv = merge_argv(&staging, &root.to_string_lossy());
    let output = std::process::Command::new(&argv[0]).args(&argv[1..]).output().expect("sh");
    assert!(output.status.success(), "{output:?}");
    assert!(!staged.exists(), "the staging folder is gone");
    assert_eq!(fs::read_to_string(root.join("sub/old")).expect("old"), "old");
    assert_eq!(fs::read_to_string(root.join("sub/new")).expect("new"), "new");
    assert_eq!(fs::read_to_string(root.join("file")).expect("file"), "after");
    assert_eq!(fs::read_to_string(root.join(".hidden")).expect("hidden"), "hidden");
    for name in odd {
        assert_eq!(fs::read_to_string(root.join("fresh").join(name)).expect(name), name);
    }
    assert_eq!(fs::read_dir(root.join("fresh")).expect("list").count(), odd.len());
    assert!(!root.join("escape").is_symlink(), "the link was replaced, not followed");
    assert_eq!(fs::read_dir(outside.path()).expect("list").count(), 0);
    // A file over a folder is refused.
    let staging = staging_path(&root.to_string_lossy()).expect("staging");
    fs::create_dir_all(&staging).expect("mkdir");
    fs::write(std::path::Path::new(&staging).join("sub"), "a file").expect("write");
    let argv = merge_argv(&staging, &root.to_string_lossy());
    let output = std::process::Command::new(&argv[0]).args(&argv[1..]).output().expect("sh");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot replace the folder"), "{output:?}");
    assert!(!std::path::Path::new(&staging).exists(), "a refused merge removes its staging folder");
    assert_eq!(fs::read_to_string(root.join("sub/old")).expect("old"), "old");
}

/// Runs [`UNPACK_SEALED`] with the host's `sh` and `tar` on `stream`.
fn unpack_sealed(stream: &[u8], dest: &std::path::Path, seal: &str) -> (Option<i32>, String) {
    use std::io::Write as _;
    let staging = staging_path(&dest.to_string_lossy()).expect("staging");
    let argv = unpack_sealed_argv(&staging, &dest.to_string_lossy(), seal);
    let mut child = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("sh");
    let _ = child.stdin.take().expect("stdin").write_all(stream);
    let output = child.wait_with_output().expect("wait");
    assert!(!std::path::Path::new(&staging).exists(), "the staging folder is gone");
    (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn a_sealed_upload_unpacks_and_merges_in_one_command_and_nothing_else_does() {
    let source = tempfile::tempdir().expect("tempdir");
    fs::create_dir(source.path().join("sub")).expect("mkdir");
    fs::write(source.path().join("sub/new"), "new").expect("write");
    // An upload cannot forge the seal: a file named like one is content.
    fs::write(source.path().join(".knotless-sealed-0000000000000000"), "content").expect("write");
    let archive = crate::tarball::pack_dir(source.path(), Vec::new()).expect("pack");
    let seal = seal_name().expect("seal");
    let mut sealed = Vec::new();
    crate::tarball::copy_vetted_sealed(archive.as_slice(), &mut sealed, &seal).expect("sealed");
    let mut unsealed = Vec::new();
    crate::tarball::copy_vetted(archive.as_slice(), &mut unsealed).expect("vetted");

    let dest = tempfile::tempdir().expect("tempdir");
    let root = dest.path();
    fs::create_dir(root.join("sub")).expect("mkdir");
    fs::write(root.join("sub/old"), "old").expect("write");
    let listing = |root: &std::path::Path| {
        let mut names: Vec<_> = walk(root);
        names.sort();
        names
    };
    let before = listing(root);
    // Whole but without its seal, cut just before the seal (at an entry's edge, which tar
    // takes for an end), cut in the middle: nothing reaches the destination.
    for cut in [unsealed.as_slice(), &sealed[..sealed.len() - 1024 - 512], &sealed[..sealed.len() / 2]] {
        let (code, stderr) = unpack_sealed(cut, root, &seal);
        assert_eq!(code, Some(UNPACK_CUT), "{stderr}");
        assert_eq!(listing(root), before, "nothing of a cut upload is left");
    }
    let (code, stderr) = unpack_sealed(&sealed, root, &seal);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(fs::read_to_string(root.join("sub/old")).expect("old"), "old");
    assert_eq!(fs::read_to_string(root.join("sub/new")).expect("new"), "new");
    assert_eq!(fs::read_to_string(root.join(".knotless-sealed-0000000000000000")).expect("content"), "content");
    assert!(!root.join(&seal).exists(), "the seal is removed");
    // A file over a folder: unpacked whole, refused at the merge, the destination as it was.
    let file_over_folder = tempfile::tempdir().expect("tempdir");
    fs::write(file_over_folder.path().join("sub"), "a file").expect("write");
    let archive = crate::tarball::pack_dir(file_over_folder.path(), Vec::new()).expect("pack");
    let mut sealed = Vec::new();
    crate::tarball::copy_vetted_sealed(archive.as_slice(), &mut sealed, &seal).expect("sealed");
    let before = listing(root);
    let (code, stderr) = unpack_sealed(&sealed, root, &seal);
    assert_eq!(code, Some(UNPACK_UNMERGED), "{stderr}");
    assert!(stderr.contains("cannot replace the folder"), "{stderr}");
    assert_eq!(listing(root), before);
}

/// Every path below `root`, relative to it.
fn walk(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in fs::read_dir(&folder).expect("list") {
            let path = entry.expect("entry").path();
            if path.is_dir() && !path.is_symlink() {
                folders.push(path.clone());
            }
            found.push(path.strip_prefix(root).expect("below").to_path_buf());
        }
    }
    found
}

/// An upload of `archive` as the executor reads it from the side channel.
async fn upload_of(archive: Vec<u8>, dir: &std::path::Path) -> crate::sdk::UploadStream {
    use tokio::io::AsyncWriteExt;
    let listener = crate::channel::ChannelListener::bind(&dir.join("side")).expect("bind");
    let path = listener.path().to_string_lossy().into_owned();
    let (ours, theirs) = tokio::join!(crate::channel::connect(&path), listener.accept());
    let mut theirs = theirs.expect("accept");
    tokio::spawn(async move {
        let _ = theirs.write_all(&archive).await;
    });
    crate::sdk::UploadStream::new(ours.expect("connect"), u64::MAX).0
}

#[tokio::test]
async fn an_upload_fed_through_a_childs_pipe_arrives_whole_and_sealed_or_fails_without_waiting() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = dir.path().join("tree");
    fs::create_dir(&tree).expect("mkdir");
    // 8 MiB, more than the widened pipe holds, in files of 1 MiB.
    for index in 0..8u8 {
        fs::write(tree.join(format!("file-{index}")), vec![index; 1 << 20]).expect("write");
    }
    let archive = crate::tarball::pack_dir(&tree, Vec::new()).expect("pack");
    let spawn = |script: &str| {
        tokio::process::Command::new("sh").args(["-c", script]).stdin(std::process::Stdio::piped()).spawn().expect("sh")
    };

    // Whole: every entry, then the seal, then the end of the stream.
    let copy = dir.path().join("copy.tar");
    let mut child = spawn(&format!("cat > '{}'", copy.display()));
    let stdin = child.stdin.take().expect("stdin");
    let upload = upload_of(archive.clone(), dir.path()).await;
    feed_vetted_sealed_pipe(upload, stdin, "/dest", ".seal-1").await.expect("fed");
    assert!(child.wait().await.expect("cat").success());
    let copied = fs::read(&copy).expect("copy");
    let mut names = Vec::new();
    for entry in tar::Archive::new(copied.as_slice()).entries().expect("entries") {
        let mut entry = entry.expect("entry");
        let name = entry.path().expect("path").to_string_lossy().into_owned();
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut bytes).expect("read");
        if let Some(index) = name.strip_prefix("file-") {
            let index: u8 = index.parse().expect("index");
            assert!(bytes.len() == 1 << 20 && bytes.iter().all(|&byte| byte == index), "{name}");
        }
        names.push(name);
    }
    assert_eq!(names.iter().filter(|name| name.starts_with("file-")).count(), 8, "{names:?}");
    assert_eq!(names.last().map(String::as_str), Some(".seal-1"), "{names:?}");

    // A reader that stops early: the feed fails (the pipe broke), and returns.
    let mut child = spawn("head -c 1000 > /dev/null");
    let stdin = child.stdin.take().expect("stdin");
    let upload = upload_of(archive.clone(), dir.path()).await;
    let fed = tokio::time::timeout(Duration::from_secs(20), feed_vetted_sealed_pipe(upload, stdin, "/dest", ".s"))
        .await
        .expect("the feed returns");
    let error = fed.expect_err("a broken pipe");
    assert!(error.message.contains("/dest"), "{error:?}");
    assert!(child.wait().await.expect("head").success());

    // A refused entry: nothing after it, and no seal.
    let mut evil = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Symlink);
    header.set_size(0);
    evil.append_link(&mut header, "out", "../../etc").expect("link");
    let mut header = tar::Header::new_gnu();
    header.set_size(4);
    evil.append_data(&mut header, "after", &b"data"[..]).expect("data");
    let evil = evil.into_inner().expect("tar");
    let copy = dir.path().join("refused.tar");
    let mut child = spawn(&format!("cat > '{}'", copy.display()));
    let stdin = child.stdin.take().expect("stdin");
    let upload = upload_of(evil, dir.path()).await;
    let error = feed_vetted_sealed_pipe(upload, stdin, "/dest", ".seal-2").await.expect_err("refused");
    assert_eq!(error.kind, crate::error::ErrorKind::TooLarge, "{error:?}");
    assert!(child.wait().await.expect("cat").success());
    let copied = fs::read(&copy).expect("copy");
    assert!(!copied.windows(7).any(|window| window == b".seal-2" || window == b"after\0\0"), "{copied:?}");
}
