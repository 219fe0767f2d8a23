//! The pod's `/proc`, read through `kubectl exec`: the process ids before a secret-bearing
//! step, and the kill of every process carrying a step's marker that was not there before.
//! The scripts are POSIX `sh` with busybox tools; the marker goes in argv (it is no secret).

use std::collections::BTreeSet;

use knotless_protocol::ExecutorError;

use crate::kubectl::{self, Kubectl};
use crate::session::CALL_LIMIT;

/// The variable that marks every process of a step, so leftovers can be found in `/proc`.
pub const MARKER: &str = "KNOTLESS_STEP_MARKER";

/// Prints the pod's process ids, one a line.
pub const LIST: &str = "for d in /proc/[0-9]*; do echo \"${d#/proc/}\"; done";

/// Kills (SIGKILL) every process whose environment holds `MARKER=$1` and whose id is not in
/// the space-separated `$2`; prints how many.
pub const KILL: &str = "n=0
for d in /proc/[0-9]*; do
  p=${d#/proc/}
  case \" $2 \" in *\" $p \"*) continue;; esac
  if tr '\\000' '\\n' < \"$d/environ\" 2>/dev/null | grep -qxF \"$3=$1\"; then
    kill -KILL \"$p\" 2>/dev/null && n=$((n+1))
  fi
done
echo \"$n\"";

/// The argv of [`LIST`].
pub fn list_args(pod: &str) -> Vec<String> {
    kubectl::exec_args(pod, &["sh", "-c", LIST])
}

/// The argv of [`KILL`] for a marker, sparing `before`.
pub fn kill_args(pod: &str, marker: &str, before: &BTreeSet<u32>) -> Vec<String> {
    let spared = before.iter().map(u32::to_string).collect::<Vec<_>>().join(" ");
    kubectl::exec_args(pod, &["sh", "-c", KILL, "sh", marker, &spared, MARKER])
}

/// Parses [`LIST`]'s output.
pub fn parse_list(output: &[u8]) -> BTreeSet<u32> {
    String::from_utf8_lossy(output).lines().filter_map(|line| line.trim().parse().ok()).collect()
}

/// The pod's process ids.
pub async fn list(kubectl: &Kubectl, pod: &str) -> Result<BTreeSet<u32>, ExecutorError> {
    let output = kubectl.ok(&list_args(pod), None, CALL_LIMIT).await?;
    Ok(parse_list(&output.stdout))
}

/// Kills a step's processes; how many were killed.
pub async fn kill(kubectl: &Kubectl, pod: &str, marker: &str, before: &BTreeSet<u32>) -> Result<u32, ExecutorError> {
    let output = kubectl.ok(&kill_args(pod, marker, before), None, CALL_LIMIT).await?;
    let text = String::from_utf8_lossy(&output.stdout);
    text.trim().parse().map_err(|_| {
        ExecutorError::infrastructure(format!("the process sweep in pod {pod} answered {:?}", text.trim()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_argv_spares_the_listed_processes() {
        let args = kill_args("p", "m.1", &BTreeSet::from([1, 7]));
        assert_eq!(&args[..6], &["exec", "-i", "p", "-c", "run", "--"]);
        assert_eq!(&args[9..], &["sh", "m.1", "1 7", MARKER]);
        assert_eq!(parse_list(b"1\n7\nx\n"), BTreeSet::from([1, 7]));
    }

    #[test]
    fn the_kill_script_finds_marked_processes() {
        // Run the script on this host against a marked sleep of our own.
        let mut child =
            std::process::Command::new("sleep").arg("30").env(MARKER, "test-marker-kill").spawn().expect("sleep");
        let output = std::process::Command::new("sh")
            .args(["-c", KILL, "sh", "test-marker-kill", "", MARKER])
            .output()
            .expect("sh");
        assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "1");
        let status = child.wait().expect("wait");
        assert!(!status.success());
    }
}
