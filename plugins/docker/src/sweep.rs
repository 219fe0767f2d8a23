//! The marker variable every process of a step carries inside the container, and the script
//! that sweeps a step's processes out of the container's `/proc` by it.
//!
//! A step's payload is built by [`knotless_protocol::sdk::payload`]; `docker exec` ends only
//! when every process holding its output ends, so a service a step leaves running keeps it
//! open: the step's completion is proven by the payload's sentinel, `docker exec`'s own end is
//! only awaited for a short while after it, and every kill is this sweep (killing the local
//! `docker exec` kills nothing in the container).

/// The variable every process of a step carries, so the sweep finds them in `/proc`.
pub const MARKER: &str = "KNOTLESS_STEP";

/// Kills, inside the container, every process whose environment holds `KNOTLESS_STEP=$1`,
/// round after round until none is left, and prints how many it killed.
pub const SWEEP: &str = r#"m="KNOTLESS_STEP=$1"; seen=" "; n=0; round=0
while [ "$round" -lt 20 ]; do
  round=$((round + 1)); found=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$p" = "$$" ] && continue
    if tr '\000' '\n' < "$d/environ" 2>/dev/null | grep -qxF -e "$m"; then
      kill -9 "$p" 2>/dev/null && found=1
      case "$seen" in *" $p "*) ;; *) seen="$seen$p "; n=$((n + 1)) ;; esac
    fi
  done
  [ "$found" = 0 ] && break
done
echo "$n""#;
