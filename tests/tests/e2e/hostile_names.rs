//! Names are data, never paths: workflow files whose stems would name folders (`...yml` has the
//! stem `..`) are refused when read, before any step runs, and nothing beside the outputs folder
//! is touched.

use knotless_tests::{Repo, knotless_run, ran};

#[test]
fn a_workflow_named_dot_dot_is_refused_and_deletes_nothing() {
    for file in ["...yml", "..yml"] {
        let repo = Repo::new();
        repo.write(&format!(".knotless/workflows/{file}"), "steps:\n  - name: touch\n    run: touch ran-a-step\n");
        let place = tempfile::tempdir().expect("tempdir");
        let keep = place.path().join("precious.txt");
        std::fs::write(&keep, "user data").expect("write");
        let outputs = place.path().join("outs");
        let work = tempfile::tempdir().expect("tempdir");
        let run = ran(knotless_run(&[
            "run",
            &repo.path().display().to_string(),
            "--executor",
            "shell",
            "--executor-option",
            &format!("work-dir={}", work.path().display()),
            "--outputs",
            &outputs.display().to_string(),
        ]));
        assert_ne!(run.code, Some(0), "{file}: {}", run.both());
        assert!(run.both().contains(&format!(".knotless/workflows/{file}")), "{file}: {}", run.both());
        assert!(run.both().contains("`.` or `..`"), "{file}: {}", run.both());
        assert_eq!(std::fs::read_to_string(&keep).ok().as_deref(), Some("user data"), "{file}: {}", run.both());
        assert!(!repo.path().join("ran-a-step").exists(), "{file}: a step ran\n{}", run.both());
    }
}
