//! Tests of workflow parsing: the model, defaults, and every error's file, line, column and field.

mod features;

use std::time::Duration;

use super::*;

const FILE: &str = ".knotless/workflows/build.yml";

/// Parses `text` and checks the error's `line:column: message` (file is always [`FILE`]).
fn check(text: &str, expected: &str) {
    match parse("build", FILE, text) {
        Ok(workflow) => panic!("expected {expected:?}, parsed {workflow:?}"),
        Err(error) => {
            assert_eq!(error.file, FILE);
            assert_eq!(error.to_string(), format!("{FILE}:{expected}"), "{text}");
        }
    }
}

fn parse_ok(text: &str) -> Workflow {
    match parse("build", FILE, text) {
        Ok(workflow) => workflow,
        Err(error) => panic!("{error}"),
    }
}

const FULL: &str = r#"
on:
  push: { branches: [main, "release/*"] }
  pull: { branches: [main] }
  queue: {}
image: debian:stable
resources: { cpu: "2", memory: 4Gi }
timeout: 30m
env: { RUST_LOG: info, RETRIES: 3, VERBOSE: true, RATIO: 1.50 }
cache: [target, /cache]
runners: [did:plc:abc]
queue: first
network: true
working-directory: app
steps:
  - name: build
    run: |
      cargo build
      cargo test
    timeout: 10m
    secrets: [DEPLOY_TOKEN]
    env: { PROFILE: release }
    shell: bash
    continue-on-error: true
  - name: lint
    uses: lint-shell
    working-directory: tools/lint/
    if: failure() || env.RUST_LOG == 'debug'
"#;

#[test]
fn reads_every_field() {
    let workflow = parse_ok(FULL);
    let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    };
    let expected = Workflow {
        name: "build".to_string(),
        file: FILE.to_string(),
        on: Triggers {
            push: Some(BranchFilter { branches: Some(vec!["main".to_string(), "release/*".to_string()]), paths: None }),
            pull: Some(BranchFilter { branches: Some(vec!["main".to_string()]), paths: None }),
            queue: true,
            manual: None,
        },
        image: Some("debian:stable".to_string()),
        resources: Resources { cpu: Some("2".to_string()), memory: Some("4Gi".to_string()) },
        timeout: Duration::from_secs(30 * 60),
        env: map(&[("RUST_LOG", "info"), ("RETRIES", "3"), ("VERBOSE", "true"), ("RATIO", "1.50")]),
        cache: vec!["target".to_string(), "/cache".to_string()],
        runners: vec!["did:plc:abc".to_string()],
        queue: Some(QueuePhase::First),
        network: true,
        steps: vec![
            Step {
                name: "build".to_string(),
                run: Some("cargo build\ncargo test\n".to_string()),
                uses: None,
                timeout: Some(Duration::from_secs(600)),
                secrets: vec!["DEPLOY_TOKEN".to_string()],
                env: map(&[("PROFILE", "release")]),
                continue_on_error: true,
                working_directory: Some("app".to_string()),
                shell: Shell::Bash,
                condition: None,
            },
            Step {
                name: "lint".to_string(),
                run: None,
                uses: Some("lint-shell".to_string()),
                timeout: None,
                secrets: vec![],
                env: BTreeMap::new(),
                continue_on_error: false,
                working_directory: Some("tools/lint".to_string()),
                shell: Shell::Sh,
                condition: Some(Condition::parse("failure() || env.RUST_LOG == 'debug'", Scope::Step).expect("reads")),
            },
        ],
        matrix: Vec::new(),
        max_parallel: None,
        base: None,
        needs: Vec::new(),
        condition: None,
        services: Vec::new(),
    };
    assert_eq!(workflow, expected);
    assert_eq!(workflow.step_timeout(0), Duration::from_secs(600));
    assert_eq!(workflow.step_timeout(1), Duration::from_secs(30 * 60));
    assert_eq!(workflow.step_timeout(9), Duration::from_secs(30 * 60));
}

#[test]
fn defaults() {
    let workflow = parse_ok("steps:\n  - { name: a, run: 'true' }\n");
    assert_eq!(workflow.on, Triggers::default());
    assert!(workflow.on.matches(Event::Push, Some("any/branch")));
    assert!(!workflow.on.matches(Event::Pull, Some("main")));
    assert!(!workflow.on.matches(Event::Queue, None));
    assert_eq!(workflow.timeout, DEFAULT_TIMEOUT);
    assert_eq!(workflow.image, None);
    assert_eq!(workflow.resources, Resources::default());
    assert!(workflow.env.is_empty() && workflow.cache.is_empty() && workflow.runners.is_empty());
    assert_eq!(workflow.queue, None);
    assert!(!workflow.network);
    // A step timeout longer than the run's is capped by it.
    let workflow = parse_ok("timeout: 1m\nsteps:\n  - { name: a, run: 'true', timeout: 1h }\n");
    assert_eq!(workflow.step_timeout(0), Duration::from_secs(60));
}

#[test]
fn on_forms() {
    let on = |text: &str| parse_ok(&format!("on: {text}\nsteps:\n  - {{ name: a, run: x }}\n")).on;
    let all = Some(BranchFilter::default());
    assert_eq!(on("[push, pull]"), Triggers { push: all.clone(), pull: all.clone(), queue: false, manual: None });
    assert_eq!(on("queue"), Triggers { push: None, pull: None, queue: true, manual: None });
    assert_eq!(on("{pull: }"), Triggers { push: None, pull: all.clone(), queue: false, manual: None });
    assert_eq!(on("{push: {}, queue: }"), Triggers { push: all, pull: None, queue: true, manual: None });
}

#[test]
fn trigger_matching() {
    let triggers = parse_ok(FULL).on;
    let cases = [
        (Event::Push, Some("main"), true),
        (Event::Push, Some("release/1.0"), true),
        (Event::Push, Some("release/"), true),
        (Event::Push, Some("feature"), false),
        (Event::Push, None, false),
        (Event::Pull, Some("main"), true),
        (Event::Pull, Some("release/1.0"), false),
        (Event::Queue, None, true),
    ];
    for (event, branch, expected) in cases {
        assert_eq!(triggers.matches(event, branch), expected, "{event} {branch:?}");
    }
    for (pattern, text, expected) in [
        ("main", "main", true),
        ("main", "mainx", false),
        ("*", "", true),
        ("*", "a/b", true),
        ("release/*", "release/a/b", true),
        ("*-rc", "1.0-rc", true),
        ("*-rc", "1.0-rc2", false),
        ("a*b*c", "aXbYbZc", true),
        ("a*b*c", "aXbYbZ", false),
        ("**", "x", true),
    ] {
        assert_eq!(glob_matches(pattern, text), expected, "{pattern} {text}");
    }
}

#[test]
fn events_round_trip() {
    for event in Event::ALL {
        assert_eq!(event.as_str().parse::<Event>(), Ok(event));
    }
    let error = "merge".parse::<Event>().map(|_| ()).map_err(|e| e.to_string());
    assert_eq!(error, Err("unknown event \"merge\", expected push, pull, queue or manual".to_string()));
}

#[test]
fn yaml_errors_name_line_column_and_field() {
    check(
        "steps:\n  - name: a\n    run: x\n  - name: b\n    run: y\n    timeout: 10 minutes\n",
        r#"6:14: steps[1].timeout: invalid duration "10 minutes", expected e.g. 90s, 10m, 1h"#,
    );
    check(
        "timeout: 90\nsteps:\n  - {name: a, run: x}\n",
        "1:10: timeout: invalid duration 90, expected e.g. 90s, 10m, 1h",
    );
    check(
        "steps:\n  - name: a\n    run: x\n    tmeout: 5s\n",
        "4:5: steps[0].tmeout: unknown field `tmeout`, expected one of name, run, uses, timeout, secrets, env, continue-on-error, working-directory, shell, if",
    );
    check("steps:\n  - run: a\n", "2:5: steps[0]: missing field `name`");
    check("steps:\n  - name: [a]\n    run: x\n", "2:11: steps[0].name: expected string scalar");
    check("steps: [\n", "1:8: unclosed bracket '['");
    check(
        "stepz: []\n",
        "1:1: stepz: unknown field `stepz`, expected one of on, image, resources, timeout, env, cache, runners, queue, network, working-directory, matrix, needs, if, services, steps",
    );
    check(
        "on: {push: {branch: [main]}}\nsteps:\n  - {name: a, run: x}\n",
        "1:13: on.push.branch: unknown field `branch`, expected one of branches, paths, inputs",
    );
    check("queue: last\nsteps:\n  - {name: a, run: x}\n", "1:8: queue: unknown variant `last`, expected one of first");
    check("steps:\n  - name: a\n    run: x\n    env: {A: ~}\n", "4:14: steps[0].env.A: null is not allowed here");
    check(
        "steps:\n  - {name: a, run: x}\n  - name: b\n    name: c\n",
        "4:5: steps[1].name: duplicate mapping key `name` is not allowed here",
    );
    check(
        "steps:\n  - {name: a, run: x}\n---\nsteps: []\n",
        "4:1: only single YAML document expected but multiple found",
    );
    check("", "1:1: the file is empty, expected a mapping with steps");
    check("# only a comment\n", "1:1: the file is empty, expected a mapping with steps");
}

#[test]
fn semantic_errors_point_at_the_field() {
    check("image: debian\n", "1:1: missing field `steps`");
    check("steps: []\n", "1:8: steps: a workflow needs at least one step");
    check("steps:\n  - name: a\n", "2:5: steps[0]: a step needs `run` or `uses`");
    check(
        "steps:\n  - name: a\n    run: x\n    uses: y\n",
        "4:11: steps[0].uses: a step has either `run` or `uses`, not both",
    );
    check("steps:\n  - {name: a, run: x}\n  - {name: a, run: y}\n", r#"3:12: steps[1].name: duplicate step name "a""#);
    check(
        "env:\n  1X: y\nsteps:\n  - {name: a, run: x}\n",
        r#"2:3: env.1X: invalid variable name "1X", expected letters, digits and _, not starting with a digit"#,
    );
    check(
        "steps:\n  - name: a\n    run: x\n    env: {KNOTLESS_COMMIT: x}\n",
        r#"4:11: steps[0].env.KNOTLESS_COMMIT: variable name "KNOTLESS_COMMIT" is reserved: names starting with KNOTLESS_ are the runner's"#,
    );
    check(
        "steps:\n  - name: a\n    run: x\n    secrets: [OK, bad-name]\n",
        r#"4:19: steps[0].secrets[1]: invalid secret name "bad-name", expected letters, digits and _, not starting with a digit"#,
    );
    check(
        "steps:\n  - name: a\n    run: x\n    secrets: [KNOTLESS_X]\n",
        r#"4:15: steps[0].secrets[0]: secret name "KNOTLESS_X" is reserved: names starting with KNOTLESS_ are the runner's"#,
    );
    check(
        "steps:\n  - name: a\n    run: x\n    secrets: [A, A]\n",
        r#"4:18: steps[0].secrets[1]: secret "A" is listed twice"#,
    );
    check(
        "steps:\n  - name: a\n    run: x\n    timeout: 0s\n",
        "4:14: steps[0].timeout: timeout must be greater than zero",
    );
    check("timeout: 0m\nsteps:\n  - {name: a, run: x}\n", "1:10: timeout: timeout must be greater than zero");
    check(
        "cache: [target, ../up]\nsteps:\n  - {name: a, run: x}\n",
        r#"1:17: cache[1]: cache path "../up" must not contain .."#,
    );
    check(
        "steps:\n  - name: a\n    uses: ../../bin\n",
        r#"3:11: steps[0].uses: invalid shared step "../../bin", expected the name of a folder of .knotless/steps/ (letters, digits, ., _ and -)"#,
    );
    check("steps:\n  - name: a\n    run: ''\n", "3:10: steps[0].run: must not be empty");
    check("steps:\n  - name: ''\n    run: x\n", "2:11: steps[0].name: must not be empty");
    check(
        "resources: {cpu: 2, memory: 4GB}\nsteps:\n  - {name: a, run: x}\n",
        r#"1:29: resources.memory: invalid quantity "4GB", expected e.g. 2, 500m, 4Gi"#,
    );
    check(
        "on: [push, pul]\nsteps:\n  - {name: a, run: x}\n",
        r#"1:12: on: unknown event "pul", expected push, pull, queue or manual"#,
    );
    check(
        "on: nightly\nsteps:\n  - {name: a, run: x}\n",
        r#"1:5: on: unknown event "nightly", expected push, pull, queue or manual"#,
    );
    check("on: [push, push]\nsteps:\n  - {name: a, run: x}\n", "1:12: on: event push is listed twice");
    check("on: []\nsteps:\n  - {name: a, run: x}\n", "1:5: on: no events, expected push, pull, queue or manual");
    check(
        "on: {queue: {branches: [main]}}\nsteps:\n  - {name: a, run: x}\n",
        "1:6: on.queue: a queue trigger takes no branches (batches are for the queue's branch)",
    );
    check(
        "on: {push: {branches: []}}\nsteps:\n  - {name: a, run: x}\n",
        "1:6: on.push.branches: no branch patterns; leave `branches` out to match every branch",
    );
    check(
        "on: {push: {paths: []}}\nsteps:\n  - {name: a, run: x}\n",
        "1:6: on.push.paths: no path patterns; leave `paths` out to run whatever changed",
    );
    check(
        "on: {queue: {paths: [src]}}\nsteps:\n  - {name: a, run: x}\n",
        "1:6: on.queue: a queue trigger takes no paths (a batch runs whatever it changes)",
    );
    check(
        "on:\n  pull:\n    paths: [src/**, /etc/passwd]\nsteps:\n  - {name: a, run: x}\n",
        "3:21: on.pull.paths[1]: a path pattern is relative to the repository's root, like src/** or !docs/**",
    );
    check(
        "on:\n  push:\n    paths: [\"!docs/**\"]\nsteps:\n  - {name: a, run: x}\n",
        "3:13: on.push.paths[0]: the first path pattern takes back paths no pattern matched yet: start with the paths that run",
    );
}

#[test]
fn paths_match_by_segment_and_across_them_and_negations_take_back_in_order() {
    let patterns = |list: &[&str]| list.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    let changed = |list: &[&str]| list.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    let docs = patterns(&["docs/**", "*.md", "!docs/draft/**"]);
    assert!(paths_match(&docs, &changed(&["docs/a/b/c.txt"])));
    assert!(paths_match(&docs, &changed(&["README.md"])));
    // `*` stays within one folder: a Markdown file in a folder is not `*.md`.
    assert!(!paths_match(&docs, &changed(&["src/notes.md"])));
    assert!(!paths_match(&docs, &changed(&["docs/draft/x.md"])));
    assert!(paths_match(&docs, &changed(&["docs/draft/x.md", "docs/final.md"])));
    assert!(!paths_match(&docs, &[]));
    // `**/` also matches no folder; a later positive pattern gives back what a negation took.
    assert!(paths_match(&patterns(&["**/Cargo.toml"]), &changed(&["Cargo.toml"])));
    assert!(paths_match(&patterns(&["**/Cargo.toml"]), &changed(&["a/b/Cargo.toml"])));
    assert!(paths_match(&patterns(&["src/**", "!src/gen/**", "src/gen/keep.rs"]), &changed(&["src/gen/keep.rs"])));
    assert!(!paths_match(&patterns(&["src/*.rs"]), &changed(&["src/a/b.rs"])));
    assert!(paths_match(&patterns(&["src/**.rs"]), &changed(&["src/a/b.rs"])));
    let triggers = Triggers {
        push: Some(BranchFilter { branches: None, paths: Some(docs) }),
        pull: None,
        queue: false,
        manual: None,
    };
    assert_eq!(
        triggers.paths_refusal(Event::Push, &changed(&["src/lib.rs", "build.rs"])).as_deref(),
        Some("on.push.paths is [docs/**, *.md, !docs/draft/**], and none of the 2 changed path(s) matches")
    );
    assert_eq!(triggers.paths_refusal(Event::Push, &changed(&["guide.md"])), None);
}

#[test]
fn alias_bombs_fail_fast() {
    let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for level in 1..12 {
        let previous = format!("*a{}", level - 1);
        text.push_str(&format!("a{level}: &a{level} [{}]\n", vec![previous; 10].join(", ")));
    }
    text.push_str("steps:\n  - {name: a, run: x}\n");
    let started = std::time::Instant::now();
    let error = parse("build", FILE, &text).map(|_| ()).map_err(|e| e.to_string());
    assert!(error.is_err(), "{error:?}");
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
}

#[test]
fn oversized_text_is_refused() {
    let text = "#".repeat(MAX_WORKFLOW_BYTES as usize + 1);
    let error = parse("build", FILE, &text).map(|_| ()).map_err(|e| e.to_string());
    assert_eq!(error, Err(format!("{FILE}: file is larger than {MAX_WORKFLOW_BYTES} bytes")));
}

#[test]
fn error_display_omits_unknown_positions() {
    let error = WorkflowError::whole_file(FILE, "cannot read: denied");
    assert_eq!(error.to_string(), format!("{FILE}: cannot read: denied"));
}

#[test]
fn load_dir_keeps_going_past_bad_files() -> Result<(), Box<dyn std::error::Error>> {
    let root = tempfile::tempdir()?;
    let folder = root.path().join(WORKFLOWS_DIR);
    std::fs::create_dir_all(&folder)?;
    std::fs::write(folder.join("test.yaml"), "steps:\n  - {name: t, run: 'true'}\n")?;
    std::fs::write(folder.join("build.yml"), "steps:\n  - {name: b, run: 'true'}\n")?;
    std::fs::write(folder.join("broken.yml"), "steps:\n  - name: b\n    run: x\n    timeout: soon\n")?;
    std::fs::write(folder.join("build.yaml"), "steps:\n  - {name: b, run: 'true'}\n")?;
    std::fs::write(folder.join("notes.txt"), "not a workflow")?;
    std::os::unix::fs::symlink("/etc/hostname", folder.join("linked.yml"))?;
    let (workflows, errors) = load_dir(root.path());
    let names: Vec<&str> = workflows.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(names, ["build", "test"]);
    assert_eq!(workflows[0].file, ".knotless/workflows/build.yaml");
    let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        errors,
        [
            r#".knotless/workflows/broken.yml:4:14: steps[0].timeout: invalid duration "soon", expected e.g. 90s, 10m, 1h"#,
            r#".knotless/workflows/build.yml: workflow "build" is already defined by .knotless/workflows/build.yaml"#,
            ".knotless/workflows/linked.yml: not a regular file (symlinks are not followed)",
        ]
    );
    // No folder: no workflows and no errors.
    let empty = tempfile::tempdir()?;
    assert_eq!(load_dir(empty.path()), (vec![], vec![]));
    Ok(())
}

#[test]
fn demo_workflows_parse() {
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/demo");
    let (workflows, errors) = load_dir(&demo);
    assert_eq!(errors, vec![]);
    let names: Vec<&str> = workflows.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(names, ["build", "test"]);
}

#[test]
fn booleans_are_true_or_false_only() {
    let steps = "steps:\n  - name: a\n    run: 'true'\n";
    assert!(parse_ok(&format!("network: true\n{steps}")).network);
    assert!(!parse_ok(&format!("network: false\n{steps}")).network);
    for written in ["\"yes\"", "yes", "\"true\"", "on", "'false'", "1", "0", "no", "~x"] {
        match parse("build", FILE, &format!("network: {written}\n{steps}")) {
            Ok(workflow) => panic!("network: {written} was read as {}", workflow.network),
            Err(error) => {
                let shown = error.to_string();
                assert!(shown.starts_with(&format!("{FILE}:1:10: network: ")), "network: {written}: {shown}");
                assert!(shown.contains("`true` or `false`"), "network: {written}: {shown}");
            }
        }
    }
}

#[test]
fn names_that_would_be_paths_are_refused() {
    let text = "steps:\n  - name: a\n    run: 'true'\n";
    for (name, rule) in [
        ("", "empty"),
        (".", "`.` or `..`"),
        ("..", "`.` or `..`"),
        ("a/b", "path separator"),
        ("a\\b", "path separator"),
        ("evil\nname", "control character"),
        ("red\u{1b}[31m", "control character"),
        ("tab\there", "control character"),
    ] {
        match parse(name, FILE, text) {
            Ok(_) => panic!("workflow name {name:?} was accepted"),
            Err(error) => {
                assert_eq!(error.file, FILE);
                assert!(error.message.contains(rule), "{name:?}: {error}");
            }
        }
    }
    let long = "x".repeat(MAX_NAME_BYTES + 1);
    assert!(parse(&long, FILE, text).is_err());
    for name in ["-dash", "ünïcode", "...x", "a.b", "x".repeat(MAX_NAME_BYTES).as_str()] {
        assert_eq!(parse(name, FILE, text).map(|workflow| workflow.name).ok().as_deref(), Some(name));
    }
}

#[test]
fn load_dir_refuses_dot_stems() -> Result<(), Box<dyn std::error::Error>> {
    let repo = tempfile::tempdir()?;
    let folder = repo.path().join(WORKFLOWS_DIR);
    std::fs::create_dir_all(&folder)?;
    let text = "steps:\n  - name: a\n    run: 'true'\n";
    for file in ["...yml", "..yml", "good.yml"] {
        std::fs::write(folder.join(file), text)?;
    }
    let (workflows, errors) = load_dir(repo.path());
    assert_eq!(workflows.iter().map(|workflow| workflow.name.as_str()).collect::<Vec<_>>(), ["good"]);
    let files: Vec<&str> = errors.iter().map(|error| error.file.as_str()).collect();
    assert_eq!(files, [".knotless/workflows/...yml", ".knotless/workflows/..yml"], "{errors:?}");
    Ok(())
}

#[test]
fn a_refusal_names_the_filter_that_refused() {
    let filter = BranchFilter { branches: Some(vec!["main".into(), "release/*".into()]), paths: None };
    let triggers = Triggers { push: Some(filter), pull: None, queue: false, manual: None };
    assert_eq!(triggers.refusal(Event::Push, Some("release/1")), None);
    assert_eq!(
        triggers.refusal(Event::Push, Some("feature")).as_deref(),
        Some("on.push.branches is [main, release/*], and this is branch feature")
    );
    assert_eq!(
        triggers.refusal(Event::Push, None).as_deref(),
        Some("on.push.branches is [main, release/*], and this is no branch (name one with --branch)")
    );
    assert_eq!(triggers.refusal(Event::Pull, Some("main")).as_deref(), Some("not triggered by pull"));
    assert_eq!(triggers.refusal(Event::Queue, None).as_deref(), Some("not triggered by queue"));
}

#[test]
fn top_level_x_keys_are_extensions_and_skipped() {
    let text = "x-defaults: &defaults\n  run: echo shared\n  timeout: 5m\nx-list: [1, {a: b}]\n\"x-\": ~\nsteps:\n  - name: a\n    <<: *defaults\n  - {name: b, run: echo b}\nx-last: {nested: {steps: []}}\n";
    let workflow = parse_ok(text);
    assert_eq!(workflow.steps.len(), 2);
    assert_eq!(workflow.steps[0].run.as_deref(), Some("echo shared"));
    assert_eq!(workflow.steps[0].timeout, Some(Duration::from_secs(300)));
    assert_eq!(workflow.steps[1].run.as_deref(), Some("echo b"));
    // The example of docs/reference/workflows.md.
    let example = "x-rust: &rust\n  timeout: 20m\n  env: { CARGO_TERM_COLOR: always }\nsteps:\n  - name: build\n    run: cargo build\n    <<: *rust\n  - name: test\n    run: cargo test\n    <<: *rust\n";
    let workflow = parse_ok(example);
    for step in &workflow.steps {
        assert_eq!(step.timeout, Some(Duration::from_secs(1200)), "{step:?}");
        assert_eq!(step.env.get("CARGO_TERM_COLOR").map(String::as_str), Some("always"), "{step:?}");
    }
    // Only at the top level, and only with the prefix: anything else is still refused, located.
    check(
        "x-ok: 1\nX-no: 1\nsteps:\n  - {name: a, run: x}\n",
        "2:1: X-no: unknown field `X-no`, expected one of on, image, resources, timeout, env, cache, runners, queue, network, working-directory, matrix, needs, if, services, steps",
    );
    check(
        "x-ok: 1\nsteps:\n  - name: a\n    run: x\n    x-note: y\n",
        "5:5: steps[0].x-note: unknown field `x-note`, expected one of name, run, uses, timeout, secrets, env, continue-on-error, working-directory, shell, if",
    );
    check(
        "x-ok: &a 1\nstepz: []\n",
        "2:1: stepz: unknown field `stepz`, expected one of on, image, resources, timeout, env, cache, runners, queue, network, working-directory, matrix, needs, if, services, steps",
    );
    check("x-only: 1\n", "1:1: missing field `steps`");
    // An extension's key is still a key: duplicates are refused, and so is a broken value.
    check(
        "x-a: 1\nx-a: 2\nsteps:\n  - {name: a, run: x}\n",
        "2:1: x-a: duplicate mapping key `x-a` is not allowed here",
    );
    check("x-a: [\nsteps: []\n", "1:6: unclosed bracket '['");
}

#[test]
fn step_shell_working_directory_and_continue_on_error_are_checked_where_written() {
    let step = |field: &str| format!("steps:\n  - name: a\n    run: echo\n    {field}\n");
    check(&step("shell: zsh"), "4:12: steps[0].shell: unknown shell \"zsh\", expected sh or bash");
    check(&step("continue-on-error: yes"), "4:24: steps[0].continue-on-error: expected `true` or `false`, found `yes`");
    check(
        &step("working-directory: /etc"),
        "4:24: steps[0].working-directory: \"/etc\" must be relative to the work folder",
    );
    check(
        &step("working-directory: a/../../b"),
        "4:24: steps[0].working-directory: \"a/../../b\" must not hold `..`, `.` or empty parts",
    );
    check(
        &step("working-directory: a//b"),
        "4:24: steps[0].working-directory: \"a//b\" must not hold `..`, `.` or empty parts",
    );
    check(
        &step("working-directory: \"a\\nb\""),
        "4:24: steps[0].working-directory: \"a\\nb\" must not hold control characters",
    );
    check(
        "working-directory: ..\nsteps:\n  - name: a\n    run: echo\n",
        "1:20: working-directory: \"..\" must not hold `..`, `.` or empty parts",
    );
    check(
        "steps:\n  - name: a\n    uses: lint\n    shell: bash\n",
        "4:12: steps[0].shell: a shared step runs its own `run` program: `shell` is for `run` scripts",
    );
    // A step's own folder wins over the workflow's.
    let workflow = parse_ok(
        "working-directory: app\nsteps:\n  - name: a\n    run: echo\n  - name: b\n    run: echo\n    working-directory: docs\n",
    );
    let dirs: Vec<_> = workflow.steps.iter().map(|step| step.working_directory.as_deref()).collect();
    assert_eq!(dirs, [Some("app"), Some("docs")]);
}

#[test]
fn the_references_step_example_parses() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/reference/workflows.md"))
        .expect("the reference");
    let start = text.find("```yaml\nsteps:\n  - name: build\n    run: |").expect("the steps example");
    let body = &text[start + "```yaml\n".len()..];
    let example = &body[..body.find("```").expect("its end")];
    let workflow = parse_ok(example);
    let docs = &workflow.steps[2];
    assert_eq!((docs.working_directory.as_deref(), docs.shell), (Some("docs"), Shell::Bash));
    assert!(workflow.steps[3].continue_on_error);
    let fence = text.find("```yaml\nworking-directory: app\n```").expect("the working-directory example");
    assert!(fence > 0);
    parse_ok("working-directory: app\nsteps:\n  - {name: a, run: x}\n");
}
