//! `knotless-run manpage [--dir DIR]` (hidden, for packagers): the manual page `knotless-run.1`
//! on stdout, or every page (`knotless-run.1` and one per subcommand, `knotless-run-run.1`, ...)
//! written into DIR (clap_mangen, from the same definition as `--help`).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, CommandFactory as _};

use super::Cli;

/// `manpage` flags.
#[derive(Debug, Args)]
pub struct ManpageArgs {
    /// Write every page, the subcommands' too, into DIR instead (it must exist), and print the
    /// path of each.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// The command the pages describe: built, so that each subcommand is named
/// `knotless-run-NAME`, and without the help subcommand, which has no page (as
/// `clap_mangen::generate_to` does).
fn described() -> clap::Command {
    let mut command = Cli::command().disable_help_subcommand(true);
    command.build();
    command
}

/// The page of `knotless-run` itself, as roff.
pub fn page() -> anyhow::Result<Vec<u8>> {
    let mut roff = Vec::new();
    clap_mangen::Man::new(described()).render(&mut roff).context("cannot render the manual page")?;
    Ok(roff)
}

/// Writes every page into `dir` and gives their paths, `knotless-run.1` first.
pub fn write_pages(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if !dir.is_dir() {
        anyhow::bail!("--dir {}: not a folder", crate::printable::name(&dir.display().to_string()));
    }
    fn write(command: clap::Command, dir: &Path, written: &mut Vec<PathBuf>) -> anyhow::Result<()> {
        let man = clap_mangen::Man::new(command.clone());
        let path = man.generate_to(dir).with_context(|| format!("cannot write a page into {}", dir.display()))?;
        written.push(path);
        for subcommand in command.get_subcommands().filter(|subcommand| !subcommand.is_hide_set()) {
            write(subcommand.clone(), dir, written)?;
        }
        Ok(())
    }
    let mut written = Vec::new();
    write(described(), dir, &mut written)?;
    Ok(written)
}

/// Runs the subcommand.
pub fn main(args: ManpageArgs) -> anyhow::Result<ExitCode> {
    let mut stdout = std::io::stdout().lock();
    match &args.dir {
        None => stdout.write_all(&page()?).context("cannot write the manual page to stdout")?,
        Some(dir) => {
            for path in write_pages(dir)? {
                writeln!(stdout, "{}", crate::printable::name(&path.display().to_string()))
                    .context("cannot write to stdout")?;
            }
        }
    }
    stdout.flush().context("cannot write to stdout")?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_is_roff_naming_every_visible_subcommand() {
        let page = String::from_utf8(page().expect("a page")).expect("roff is text");
        assert!(page.starts_with(".ie \\n(.g .ds Aq"), "{page}");
        assert!(page.contains(".TH knotless-run 1"), "{page}");
        for name in ["run", "plugin", "checks", "logs", "notify", "secrets", "kubeconfig", "completions"] {
            assert!(page.contains(&format!("knotless\\-run\\-{name}(1)")), "{name}\n{page}");
        }
        assert!(!page.contains("manpage"), "the hidden subcommand is not in the page\n{page}");
        assert!(!page.contains("knotless\\-run\\-help(1)"), "the help subcommand has no page\n{page}");
    }

    #[test]
    fn every_page_is_written_and_named_after_its_command() {
        let dir = tempfile::tempdir().expect("tempdir");
        let written = write_pages(dir.path()).expect("pages");
        let names: Vec<String> =
            written.iter().map(|path| path.file_name().expect("a name").to_string_lossy().into_owned()).collect();
        assert_eq!(names.first().map(String::as_str), Some("knotless-run.1"));
        for name in ["knotless-run-run.1", "knotless-run-plugin-check.1", "knotless-run-completions.1"] {
            assert!(names.iter().any(|written| written == name), "{name}: {names:?}");
        }
        assert!(!names.iter().any(|name| name.contains("manpage") || name.contains("help")), "{names:?}");
        assert!(write_pages(&dir.path().join("missing")).is_err());
    }
}
