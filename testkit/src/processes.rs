//! Looks at this host's processes through `/proc`: whether one lives, which hold a variable in
//! their environment, and their command lines, for tests that check an executor leaves nothing
//! running and puts no secret where another user could read it.

/// Whether a process lives (exists and is not a zombie).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit_once(')').map(|(_, fields)| !fields.trim_start().starts_with('Z')).unwrap_or(false),
        Err(_) => false,
    }
}

/// The live processes whose environment holds `NAME=value` exactly.
pub fn processes_with(variable: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for (pid, _) in pids() {
        if !alive(pid) {
            continue;
        }
        if let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ"))
            && environ.split(|&byte| byte == 0).any(|entry| entry == variable.as_bytes())
        {
            found.push(pid);
        }
    }
    found
}

/// The command line of every process on this host with one (a zombie has none), its
/// arguments joined by spaces.
pub fn command_lines() -> Vec<(i32, String)> {
    let mut found = Vec::new();
    for (pid, folder) in pids() {
        if let Ok(bytes) = std::fs::read(folder.join("cmdline"))
            && !bytes.is_empty()
        {
            found.push((pid, String::from_utf8_lossy(&bytes).replace('\0', " ")));
        }
    }
    found
}

/// Every command line on this host that contains `needle`.
pub fn cmdlines_containing(needle: &str) -> Vec<String> {
    command_lines().into_iter().filter(|(_, line)| line.contains(needle)).map(|(_, line)| line).collect()
}

/// Every process's id and `/proc` folder.
fn pids() -> impl Iterator<Item = (i32, std::path::PathBuf)> {
    std::fs::read_dir("/proc").into_iter().flatten().flatten().filter_map(|entry| {
        let pid = entry.file_name().to_str()?.parse::<i32>().ok()?;
        Some((pid, entry.path()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_lives_and_its_command_line_and_environment_are_seen() {
        let me = std::process::id() as i32;
        assert!(alive(me));
        assert!(!alive(i32::MAX));
        let (_, line) = command_lines().into_iter().find(|(pid, _)| *pid == me).expect("this process's command line");
        let program = std::env::args().next().expect("argv[0]");
        assert!(line.starts_with(&program), "{line}");
        assert!(cmdlines_containing(&program).contains(&line));
        let path = std::env::var("PATH").expect("PATH");
        assert!(processes_with(&format!("PATH={path}")).contains(&me));
    }
}
