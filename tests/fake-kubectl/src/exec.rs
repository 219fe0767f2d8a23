//! `kubectl exec`: runs the command for real inside the pod's namespaces
//! (`nsenter --target <pid 1> --pid --mount --root --wd`), with a clean container
//! environment, forwarding stdin, stdout and stderr, and exiting with the command's code.
//!
//! Mid-step injections fire on the first byte a `sh -s` exec writes to stdout, once:
//! `node-lost-after-ready` (the pod fails with NodeLost, its processes die),
//! `job-deleted-mid-step` (the Job and pod are deleted), `drop-exec-stream` (the stream
//! closes without the rest; the step goes on in the pod until someone kills it).

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use anyhow::bail;

use crate::pods::{self, POD_PATH};
use crate::store::{self, Store, text};

/// Runs `kubectl exec [-i] POD [-c C] -- CMD...`; the exit code.
pub fn exec(dir: &Path, argv: &[String], namespace: &str, args: &[String]) -> anyhow::Result<i32> {
    let split = args.iter().position(|arg| arg == "--").unwrap_or(args.len());
    let (flags, command) = (&args[..split], args.get(split + 1..).unwrap_or(&[]));
    let mut pod_name = None;
    let mut iter = flags.iter();
    while let Some(flag) = iter.next() {
        match flag.as_str() {
            "-i" | "--stdin" | "-t" | "--tty" | "-it" => {}
            "-c" | "--container" => {
                iter.next();
            }
            other if !other.starts_with('-') => pod_name = Some(other.to_string()),
            _ => {}
        }
    }
    let Some(pod_name) = pod_name else { bail!("error: expected 'exec POD_NAME COMMAND [ARG1] [ARG2] ... [ARGN]'") };
    if command.is_empty() {
        bail!("error: you must specify at least one command for the container");
    }
    let (init, step_trigger) = {
        let mut store = Store::open(dir)?;
        let Some(index) = store.find("Pod", namespace, &pod_name) else {
            bail!("Error from server (NotFound): pods \"{pod_name}\" not found");
        };
        let pod = &store.data.objects[index];
        if text(pod, "/status/phase") != "Running" {
            bail!("error: unable to upgrade connection: container not found (\"run\")");
        }
        let Some(init) = pods::init_pid(pod) else { bail!("error: unable to upgrade connection: pod has no sandbox") };
        let mut trigger = None;
        if command == ["sh", "-s"] {
            let injected = store::injected(dir);
            for name in ["node-lost-after-ready", "job-deleted-mid-step", "drop-exec-stream"] {
                if injected.contains(name) && !store.data.fired.contains(name) {
                    store.data.fired.insert(name.to_string());
                    trigger = Some(name.to_string());
                    break;
                }
            }
            store.save()?;
        }
        (init, trigger)
    };
    let mut child = Command::new("nsenter")
        .args(["--target", &init.to_string(), "--pid", "--mount", "--root", "--wd", "--"])
        .args(["/bin/env", "-i", &format!("PATH={POD_PATH}"), "HOME=/root", &format!("HOSTNAME={pod_name}")])
        .args(command)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let recorded = Arc::new(Mutex::new(Vec::new()));
    let mut child_stdin = child.stdin.take();
    let record = recorded.clone();
    let feeder = std::thread::spawn(move || {
        let mut buffer = vec![0u8; 64 * 1024];
        let mut input = std::io::stdin().lock();
        while let Ok(count) = input.read(&mut buffer) {
            if count == 0 {
                break;
            }
            if let Ok(mut record) = record.lock()
                && record.len() < 8 << 20
            {
                record.extend_from_slice(&buffer[..count]);
            }
            let Some(pipe) = child_stdin.as_mut() else { break };
            if pipe.write_all(&buffer[..count]).is_err() {
                break;
            }
        }
        drop(child_stdin);
    });
    let mut stderr = child.stderr.take();
    let errors = std::thread::spawn(move || {
        if let Some(stderr) = stderr.as_mut() {
            let _ = std::io::copy(stderr, &mut std::io::stderr());
        }
    });
    let mut stdout = child.stdout.take();
    let mut buffer = vec![0u8; 64 * 1024];
    let mut trigger = step_trigger;
    while let Some(pipe) = stdout.as_mut() {
        let count = pipe.read(&mut buffer).unwrap_or(0);
        if count == 0 {
            break;
        }
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(&buffer[..count]);
        let _ = out.flush();
        drop(out);
        if let Some(name) = trigger.take() {
            fire(dir, namespace, &pod_name, &name)?;
        }
    }
    let status = child.wait()?;
    let _ = errors.join();
    // stdin may stay open with nothing more to say; the call log must not wait for it.
    drop(feeder);
    let stdin = recorded.lock().map(|record| record.clone()).unwrap_or_default();
    store::log_call(dir, argv, Some(&stdin));
    let code = status.code().unwrap_or_else(|| {
        use std::os::unix::process::ExitStatusExt;
        128 + status.signal().unwrap_or(9)
    });
    if code >= 128 {
        eprintln!("command terminated with exit code {code}");
    }
    Ok(code)
}

/// Fires a mid-step injection.
fn fire(dir: &Path, namespace: &str, pod: &str, name: &str) -> anyhow::Result<()> {
    match name {
        "drop-exec-stream" => {
            let _ = std::io::stderr().write_all(b"error: lost connection to pod\n");
            std::process::exit(1);
        }
        "node-lost-after-ready" => {
            let mut store = Store::open(dir)?;
            pods::lose_node(&mut store, pod);
            store.save()?;
        }
        _ => {
            let mut store = Store::open(dir)?;
            let job = store
                .find("Pod", namespace, pod)
                .map(|index| text(&store.data.objects[index], "/metadata/labels/job-name").to_string());
            if let Some(job) = job {
                pods::delete_where(&mut store, &|object| {
                    text(object, "/kind") == "Job" && text(object, "/metadata/name") == job
                });
            }
            store.save()?;
        }
    }
    Ok(())
}
