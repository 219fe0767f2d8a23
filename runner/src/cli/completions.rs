//! `knotless-run completions SHELL`: the shell's completion script for `knotless-run`, on
//! stdout (clap_complete, from the same definition as `--help`).

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, CommandFactory as _};
use clap_complete::Shell;

use super::Cli;

/// `completions` flags.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_name = "SHELL", value_enum)]
    pub shell: Shell,
}

/// The completion script of `shell`.
pub fn script(shell: Shell) -> Vec<u8> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "knotless-run", &mut script);
    if shell == Shell::Bash {
        // clap_complete's bash script spells a subcommand's state two ways when the binary's
        // name holds a hyphen (clap-rs/clap#6421): the loop over the words reaches
        // `knotless__run__subcmd__run`, the arms that complete are labelled
        // `knotless__subcmd__run__subcmd__run`, and nothing past the first word completes. The
        // arms are spelled as the loop spells them.
        let text = String::from_utf8_lossy(&script).replace("knotless__subcmd__run", "knotless__run");
        script = text.into_bytes();
    }
    script
}

/// Runs the subcommand.
pub fn main(args: CompletionsArgs) -> anyhow::Result<ExitCode> {
    // Made whole first: clap_complete panics on a failed write, and a closed stdout is one.
    let script = script(args.shell);
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&script).and_then(|()| stdout.flush()).context("cannot write the completions to stdout")?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::ValueEnum as _;

    use super::*;

    /// Every visible subcommand, as the words that name it (`["plugin", "check"]`), with its
    /// long flags.
    fn subcommands() -> Vec<(Vec<String>, Vec<String>)> {
        fn walk(command: &clap::Command, path: &[String], found: &mut Vec<(Vec<String>, Vec<String>)>) {
            for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set() && sub.get_name() != "help") {
                let mut words = path.to_vec();
                words.push(sub.get_name().to_string());
                let flags: Vec<String> = sub
                    .get_arguments()
                    .filter(|arg| !arg.is_hide_set())
                    .filter_map(|arg| arg.get_long().map(|long| format!("--{long}")))
                    .collect();
                found.push((words.clone(), flags));
                walk(sub, &words, found);
            }
        }
        let mut found = Vec::new();
        walk(&Cli::command(), &[], &mut found);
        found
    }

    /// Runs `shell` with `script` as its standard input, or says which package to install.
    fn shell_run(program: &str, args: &[&str], script: &str) -> String {
        use std::io::Write as _;
        let child = std::process::Command::new(program)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn();
        let mut child = child.unwrap_or_else(|error| panic!("{program}: {error}: install it (.ci/run does)"));
        child.stdin.take().expect("stdin").write_all(script.as_bytes()).expect("write the script");
        let output = child.wait_with_output().expect("the shell ends");
        assert!(output.status.success(), "{program}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    #[test]
    fn bash_and_fish_complete_each_subcommands_flags_and_zsh_holds_them() {
        let all = subcommands();
        assert!(all.iter().any(|(words, _)| words == &["plugin", "check"]), "{all:?}");
        let dir = tempfile::tempdir().expect("tempdir");
        let scripts: Vec<std::path::PathBuf> = [Shell::Bash, Shell::Fish, Shell::Zsh]
            .iter()
            .map(|shell| {
                let path = dir.path().join(shell.to_string());
                std::fs::write(&path, script(*shell)).expect("write");
                path
            })
            .collect();
        // bash: the script's own function, called as `complete -F` calls it, a line a case.
        let mut bash = format!("source '{}'\n", scripts[0].display());
        bash.push_str(
            "comp() { COMP_WORDS=(\"$@\"); COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 )); COMPREPLY=(); \
             _knotless__run knotless-run \"${COMP_WORDS[COMP_CWORD]}\" \"${COMP_WORDS[COMP_CWORD-1]}\"; \
             echo \"${COMPREPLY[*]}\"; }\n",
        );
        // fish: `complete -C`, the completions of a command line.
        let mut fish = format!("source '{}'\n", scripts[1].display());
        let mut cases = Vec::new();
        for (words, flags) in &all {
            let Some(flag) = flags.first() else { continue };
            let typed = &flag[..flag.len().min(5)];
            bash.push_str(&format!("comp knotless-run {} '{typed}'\n", words.join(" ")));
            fish.push_str(&format!(
                "complete -C 'knotless-run {} {typed}' | cut -f1 | tr '\\n' ' '; echo\n",
                words.join(" ")
            ));
            cases.push((words, flag));
        }
        // And the subcommands themselves, at the top.
        bash.push_str("comp knotless-run ru\n");
        fish.push_str("complete -C 'knotless-run ru' | cut -f1 | tr '\\n' ' '; echo\n");
        for (program, args, input) in [("bash", vec!["--norc"], bash), ("fish", vec!["--no-config"], fish)] {
            let output = shell_run(program, &args, &input);
            let lines: Vec<&str> = output.lines().collect();
            assert_eq!(lines.len(), cases.len() + 1, "{program}: {output}");
            for ((words, flag), line) in cases.iter().zip(&lines) {
                let offered: Vec<&str> = line.split_whitespace().collect();
                assert!(
                    offered.contains(&flag.as_str()),
                    "{program}: knotless-run {} <TAB> gave {line:?}, not {flag}",
                    words.join(" ")
                );
            }
            assert!(lines[cases.len()].split_whitespace().any(|word| word == "run"), "{program}: {output}");
        }
        // zsh: the script loads under compinit, and each subcommand's arm names its flags.
        let zsh = format!(
            "autoload -U compinit && compinit -u -d '{}/zcompdump'\nsource '{}'\nwhence -w _knotless-run\n",
            dir.path().display(),
            scripts[2].display()
        );
        assert!(shell_run("zsh", &["-f"], &zsh).contains("_knotless-run: function"));
        let text = String::from_utf8(script(Shell::Zsh)).expect("text");
        for (words, flags) in &all {
            let mut at = 0;
            for word in words.iter() {
                at += text[at..]
                    .find(&format!("({word})\n"))
                    .unwrap_or_else(|| panic!("zsh: no arm ({word}) of {words:?}"));
            }
            let arm = &text[at..at + text[at..].find("\n;;").unwrap_or(text.len() - at)];
            for flag in flags {
                let offered = arm.contains(&format!("{flag}[")) || arm.contains(&format!("{flag}=["));
                assert!(offered, "zsh: {words:?} lacks {flag}");
            }
        }
    }

    #[test]
    fn every_shell_completes_every_visible_subcommand() {
        let subcommands: Vec<String> = Cli::command()
            .get_subcommands()
            .filter(|command| !command.is_hide_set())
            .map(|command| command.get_name().to_string())
            .collect();
        assert!(subcommands.iter().any(|name| name == "completions"), "{subcommands:?}");
        for shell in Shell::value_variants() {
            let script = String::from_utf8(script(*shell)).expect("a script is text");
            for name in &subcommands {
                assert!(script.contains(name.as_str()), "{shell}: no {name}");
            }
        }
    }
}
