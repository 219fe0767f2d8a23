//! Tests of the workflow features beyond a job's steps: matrices, needs, paths filters, manual
//! triggers, conditions and services.

use super::*;

#[test]
fn a_matrix_runs_every_combination_named_by_its_values_with_its_variables() {
    let text = "env: { CARGO_TERM_COLOR: always }\nmatrix:\n  rust: [stable, \"1.80\"]\n  os: [debian, alpine]\n  exclude:\n    - { rust: \"1.80\", os: alpine }\n  include:\n    - { os: debian, rust: nightly }\n    - { rust: stable, os: debian }\nsteps:\n  - name: test\n    run: echo $rust $os\n";
    let workflow = parse_ok(text);
    let cells = expand(workflow);
    let names: Vec<&str> = cells.iter().map(|cell| cell.name.as_str()).collect();
    assert_eq!(
        names,
        ["build (stable, debian)", "build (stable, alpine)", "build (1.80, debian)", "build (nightly, debian)"]
    );
    let last = &cells[3];
    assert_eq!(last.base.as_deref(), Some("build"));
    assert_eq!(last.env.get("rust").map(String::as_str), Some("nightly"));
    assert_eq!(last.env.get("os").map(String::as_str), Some("debian"));
    assert_eq!(last.env.get("CARGO_TERM_COLOR").map(String::as_str), Some("always"));
    assert!(last.matrix.is_empty());
    // Only includes: they define the variables. Numbers are text as written.
    let only =
        expand(parse_ok("matrix:\n  include:\n    - { n: 1 }\n    - { n: 2.50 }\nsteps:\n  - {name: a, run: x}\n"));
    let names: Vec<&str> = only.iter().map(|cell| cell.name.as_str()).collect();
    assert_eq!(names, ["build (1)", "build (2.50)"]);
    // No matrix, one workflow as it was.
    assert_eq!(expand(parse_ok("steps:\n  - {name: a, run: x}\n")).len(), 1);
}

#[test]
fn a_bad_matrix_is_refused_where_it_is_written() {
    let steps = "steps:\n  - {name: a, run: x}\n";
    let with = |matrix: &str| format!("matrix:\n{matrix}{steps}");
    check(&with("  os: []\n"), "2:3: matrix.os: a matrix variable needs at least one value");
    check(
        &with("  KNOTLESS_X: [a]\n"),
        "2:3: matrix.KNOTLESS_X: matrix variable name \"KNOTLESS_X\" is reserved: names starting with KNOTLESS_ are the runner's",
    );
    check(
        &with("  a-b: [x]\n"),
        "2:3: matrix.a-b: invalid matrix variable name \"a-b\", expected letters, digits and _, not starting with a digit",
    );
    check(&with("  os: [debian, debian]\n"), "2:16: matrix.os[1]: value \"debian\" is listed twice");
    check(
        &with("  os: [\"a/b\"]\n"),
        "2:8: matrix.os[0]: value \"a/b\" names a run: no path separator or control character",
    );
    check(
        &with("  os: [\"a\\u001bb\"]\n"),
        "2:8: matrix.os[0]: value \"a\\u{1b}b\" names a run: no path separator or control character",
    );
    check(&with("  os: [a]\n  exclude:\n    - { os: a }\n"), "2:3: matrix: no combination is left");
    check(
        &with("  os: [a]\n  exclude:\n    - { arch: a }\n"),
        "4:9: matrix.exclude[0].arch: arch is not a variable of the matrix (os)",
    );
    check(
        &with("  os: [a]\n  include:\n    - { }\n"),
        "2:3: matrix.include[0]: an entry gives every variable of the matrix, once: os",
    );
    check(
        &with("  a: [1, 2, 3, 4, 5, 6, 7, 8, 9]\n  b: [1, 2, 3, 4, 5, 6, 7, 8]\n"),
        "2:3: matrix: more than 64 combinations: split the workflow",
    );
    check(
        &format!("env: {{ os: x }}\n{}", with("  os: [a]\n")),
        "3:3: matrix.os: os is also set by the workflow's env or the run: name it once",
    );
    let long = "x".repeat(130);
    check(
        &with(&format!("  os: [{long}]\n")),
        &format!("2:3: matrix: the run \"build ({long})\": its name is longer than 128 bytes: rename the file"),
    );
}

#[test]
fn the_references_matrix_example_parses_into_the_runs_it_names() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/reference/workflows.md"))
        .expect("the reference");
    let start = text.find("```yaml\nmatrix:\n").expect("the matrix example");
    let body = &text[start + "```yaml\n".len()..];
    let example = &body[..body.find("```").expect("its end")];
    let cells = expand(parse("test", FILE, example).expect("parses"));
    assert!(cells.iter().all(|cell| cell.max_parallel == Some(2)));
    let names: Vec<String> = cells.into_iter().map(|cell| cell.name).collect();
    let said = "This runs `test (stable, debian)`, `test (stable, alpine)`, `test (1.80, debian)` and `test (nightly, debian)`.";
    assert!(text.contains(said));
    assert_eq!(
        names,
        ["test (stable, debian)", "test (stable, alpine)", "test (1.80, debian)", "test (nightly, debian)"]
    );
}

#[test]
fn needs_name_other_workflows_and_a_cycle_or_an_unknown_name_is_refused_when_read()
-> Result<(), Box<dyn std::error::Error>> {
    let steps = "steps:\n  - {name: a, run: x}\n";
    check(&format!("needs: [build]\n{steps}"), "1:9: needs[0]: a workflow cannot need itself");
    check(&format!("needs: [a, a]\n{steps}"), "1:12: needs[1]: \"a\" is listed twice");
    check(
        &format!("on: [push, queue]\nneeds: [a]\n{steps}"),
        "2:9: needs[0]: merge-queue pre-flights and batches run without waiting for other workflows: `needs` is for push and pull runs",
    );
    let dir = tempfile::tempdir()?;
    let folder = dir.path().join(".knotless/workflows");
    std::fs::create_dir_all(&folder)?;
    let write = |name: &str, needs: &str| {
        std::fs::write(folder.join(format!("{name}.yml")), format!("needs: [{needs}]\n{steps}"))
    };
    std::fs::write(folder.join("build.yml"), format!("matrix:\n  n: [1, 2]\n{steps}"))?;
    write("test", "build")?;
    write("deploy", "test, build")?;
    write("ghost", "nowhere")?;
    write("waits", "ghost")?;
    write("ping", "pong")?;
    write("pong", "ping")?;
    write("after", "ping")?;
    let (workflows, errors) = load_dir(dir.path());
    let names: Vec<&str> = workflows.iter().map(|workflow| workflow.name.as_str()).collect();
    assert_eq!(names, ["build (1)", "build (2)", "deploy", "test"]);
    let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        errors,
        [
            ".knotless/workflows/ghost.yml: needs: \"nowhere\" is not a workflow of this repository (or it did not load)",
            ".knotless/workflows/waits.yml: needs: \"ghost\" is not a workflow of this repository (or it did not load)",
            ".knotless/workflows/after.yml: needs: a cycle of needs, or waits for one, among after, ping, pong",
            ".knotless/workflows/ping.yml: needs: a cycle of needs, or waits for one, among after, ping, pong",
            ".knotless/workflows/pong.yml: needs: a cycle of needs, or waits for one, among after, ping, pong",
        ]
    );
    Ok(())
}

#[test]
fn the_references_needs_example_parses() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/reference/workflows.md"))
        .expect("the reference");
    assert!(text.contains("```yaml\nneeds: [build, lint]\n```"));
    let workflow = parse("deploy", FILE, "needs: [build, lint]\nsteps:\n  - {name: a, run: x}\n").expect("parses");
    assert_eq!(workflow.needs, ["build", "lint"]);
}

#[test]
fn the_references_paths_example_parses() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/reference/workflows.md"))
        .expect("the reference");
    let start = text.find("```yaml\non:\n  push:\n    branches: [main]\n    paths:").expect("the paths example");
    let body = &text[start + "```yaml\n".len()..];
    let example = &body[..body.find("```").expect("its end")];
    let workflow = parse_ok(&format!("{example}steps:\n  - {{name: a, run: x}}\n"));
    let changed = |path: &str| vec![path.to_string()];
    assert_eq!(workflow.on.paths(Event::Push).map(<[String]>::len), Some(3));
    assert!(workflow.on.paths_refusal(Event::Push, &changed("src/main.rs")).is_none());
    assert!(workflow.on.paths_refusal(Event::Push, &changed("Cargo.lock")).is_none());
    assert!(workflow.on.paths_refusal(Event::Push, &changed("src/generated/api.rs")).is_some());
    assert!(workflow.on.paths_refusal(Event::Pull, &changed("README.md")).is_some());
}

#[test]
fn max_parallel_is_from_1_to_64() {
    let with =
        |limit: &str| format!("matrix:\n  n: [1, 2]\n  max-parallel: {limit}\nsteps:\n  - {{name: a, run: x}}\n");
    assert_eq!(parse_ok(&with("1")).max_parallel, Some(1));
    assert_eq!(parse_ok(&with("64")).max_parallel, Some(64));
    let message = "matrix.max-parallel: runs at most this many combinations at once: 1 to 64";
    check(&with("0"), &format!("3:17: {message}"));
    check(&with("65"), &format!("3:17: {message}"));
    check(&with("-1"), &format!("3:17: {message}"));
    assert!(parse("build", FILE, &with("two")).expect_err("not a number").to_string().contains("max-parallel"));
}

#[test]
fn a_manual_trigger_takes_inputs_with_defaults_and_nothing_else() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/reference/workflows.md"))
        .expect("the reference");
    let start = text.find("```yaml\non:\n  manual:\n").expect("the manual example");
    let body = &text[start + "```yaml\n".len()..];
    let example = &body[..body.find("```").expect("its end")];
    let workflow = parse_ok(&format!("{example}steps:\n  - {{name: a, run: x}}\n"));
    let manual = workflow.on.manual.as_ref().expect("a manual trigger");
    let inputs: Vec<(&str, &str)> = manual.inputs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(inputs, [("CHANNEL", "beta"), ("VERSION", "0.0.0")]);
    assert!(workflow.on.matches(Event::Manual, None) && !workflow.on.matches(Event::Push, Some("main")));
    assert!(parse_ok("on: manual\nsteps:\n  - {name: a, run: x}\n").on.manual.is_some_and(|m| m.inputs.is_empty()));
    let steps = "steps:\n  - {name: a, run: x}\n";
    check(
        &format!("on: {{manual: {{branches: [main]}}}}\n{steps}"),
        "1:6: on.manual: a manual trigger takes no branches or paths (`knotless-run trigger --ref` names the branch)",
    );
    check(&format!("on: {{push: {{inputs: {{A: b}}}}}}\n{steps}"), "1:6: on.push: only a manual trigger takes inputs");
    check(
        &format!("on: {{manual: {{inputs: {{A: b}}}}}}\nenv: {{A: c}}\n{steps}"),
        "1:1: on.manual.inputs.A: input A is also set by the workflow's env: name it once",
    );
    check(
        &format!("on: {{manual: {{inputs: {{1A: b}}}}}}\n{steps}"),
        "1:24: on.manual.inputs.1A: invalid variable name \"1A\", expected letters, digits and _, not starting with a digit",
    );
}

/// Path globbing by backtracking: right, and slow on many stars.
fn backtracking_glob(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) if rest.first() == Some(&b'*') => {
            let rest = &rest[1..];
            if let Some(after) = rest.strip_prefix(b"/")
                && backtracking_glob(after, text)
            {
                return true;
            }
            (0..=text.len()).any(|skip| backtracking_glob(rest, &text[skip..]))
        }
        Some((b'*', rest)) => {
            let segment = text.iter().position(|&byte| byte == b'/').unwrap_or(text.len());
            (0..=segment).any(|skip| backtracking_glob(rest, &text[skip..]))
        }
        Some((first, rest)) => text.first() == Some(first) && backtracking_glob(rest, &text[1..]),
    }
}

#[test]
fn path_globs_match_as_backtracking_would_and_many_stars_cost_no_more_than_the_lengths() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = |bound: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % bound as u64) as usize
    };
    for _ in 0..20_000 {
        let pattern: Vec<u8> = (0..next(9)).map(|_| b"ab/*"[next(4)]).collect();
        let text: Vec<u8> = (0..next(9)).map(|_| b"ab/"[next(3)]).collect();
        assert_eq!(
            path_glob(&pattern, &text),
            backtracking_glob(&pattern, &text),
            "{:?} {:?}",
            String::from_utf8_lossy(&pattern),
            String::from_utf8_lossy(&text)
        );
    }
    // Backtracking would take longer than the universe has: this ends at once.
    let stars = "*a".repeat(40) + "b";
    assert!(!path_glob(stars.as_bytes(), "a".repeat(4000).as_bytes()));
    let folders = "**/a".repeat(40) + "b";
    assert!(!path_glob(folders.as_bytes(), "a/".repeat(2000).as_bytes()));
}

/// Evaluates a step's condition read with the variables of `env`.
fn holds(text: &str, facts: Facts<'_>) -> bool {
    Condition::parse(text, Scope::Step).unwrap_or_else(|error| panic!("{text}: {error}")).holds(&facts)
}

#[test]
fn conditions_read_the_event_the_branch_the_changes_the_variables_and_the_earlier_steps() {
    let env: BTreeMap<String, String> = [("MODE".to_string(), "fast".to_string())].into();
    let changed = vec!["docs/guide.md".to_string(), "src/main.rs".to_string()];
    let facts = Facts {
        event: "push",
        branch: "main",
        git_ref: "refs/heads/main",
        changed: Some(&changed),
        env: &env,
        failed: false,
    };
    let failed = Facts { failed: true, ..facts };
    for (text, expected) in [
        ("event == 'push'", true),
        ("event != 'push'", false),
        ("branch == 'main' && ref == 'refs/heads/main'", true),
        ("${{ branch == 'release' || env.MODE == 'fast' }}", true),
        ("!(env.MODE == 'fast')", false),
        ("changed('docs/**')", true),
        ("changed('**.toml')", false),
        ("startsWith(ref, 'refs/heads/') && endsWith(branch, 'in') && contains(env.MODE, 'as')", true),
        ("contains('it''s', '''')", true),
        ("true", true),
        ("false == false", true),
        ("always()", true),
        ("success()", true),
        ("failure()", false),
    ] {
        assert_eq!(holds(text, facts), expected, "{text}");
    }
    // After a failure: only what asks about failures (or always) runs.
    for (text, expected) in [
        ("event == 'push'", false),
        ("true", false),
        ("failure()", true),
        ("always()", true),
        ("success()", false),
        ("failure() && branch == 'main'", true),
        ("!success()", true),
    ] {
        assert_eq!(holds(text, failed), expected, "{text} after a failure");
    }
    // Unknown changes (a local run, a first push): changed() is true, as paths filters pass.
    assert!(holds("changed('**.toml')", Facts { changed: None, ..facts }));
    // A variable not set reads as ''.
    assert!(holds("env.UNSET == ''", facts));
}

#[test]
fn a_bad_condition_is_refused_at_its_line_and_column_naming_what_was_expected() {
    let step = |condition: &str| format!("env: {{MODE: fast}}\nsteps:\n  - name: a\n    run: x\n    if: {condition}\n");
    check(
        &step("branch == main"),
        "5:19: steps[0].if: unknown name `main`: expected true, false, event, branch, ref, env.NAME or a function",
    );
    check(
        &step("branch == 'main' &&"),
        "5:28: steps[0].if: expected a value ('text', true, false, event, branch, ref, env.NAME, a function such as success(), or `(`), found the end of the condition",
    );
    check(&step("(event == 'push'"), "5:25: steps[0].if: expected `)`, found the end of the condition");
    check(&step("event == 'push')"), "5:24: steps[0].if: expected `&&`, `||` or the end of the condition, found `)`");
    check(
        &step("branch"),
        "5:9: steps[0].if: a condition is true or false, found a string: compare it, as in branch == 'main'",
    );
    check(
        &step("branch == true"),
        "5:19: steps[0].if: `==` compares two strings or two booleans, found a string and a boolean",
    );
    check(&step("branch && true"), "5:9: steps[0].if: `&&` takes true or false, found a string: compare it with `==`");
    check(
        &step("env.1X == 'x'"),
        "5:13: steps[0].if: unexpected '1': expected a value, `(`, `!`, `==`, `!=`, `&&` or `||`",
    );
    check(&step("env.my-name == 'x'"), "5:13: steps[0].if: expected a variable name after `env.`, found `my-name`");
    check(&step("branch == 'it"), "5:19: steps[0].if: a string that never ends: expected a closing `'`");
    check(&step("branch == \"main\""), "5:19: steps[0].if: strings are in single quotes, as in branch == 'main'");
    // Quoted in YAML, the condition's columns still count from inside the quotes.
    check(
        &step("\"branch == main\""),
        "5:20: steps[0].if: unknown name `main`: expected true, false, event, branch, ref, env.NAME or a function",
    );
    check(
        &step("bogus()"),
        "5:9: steps[0].if: unknown function bogus(): expected success(), failure(), always(), changed('pattern'), contains(text, part), startsWith(text, part) or endsWith(text, part)",
    );
    check(
        &step("changed(branch)"),
        "5:17: steps[0].if: changed() takes a path pattern in quotes, as in changed('docs/**')",
    );
    check(
        &step("success(1)"),
        "5:17: steps[0].if: unexpected '1': expected a value, `(`, `!`, `==`, `!=`, `&&` or `||`",
    );
    check(
        &step("event = 'push'"),
        "5:15: steps[0].if: unexpected '=': expected a value, `(`, `!`, `==`, `!=`, `&&` or `||`",
    );
    // A workflow's condition has no earlier steps.
    check(
        "if: failure()\nsteps:\n  - {name: a, run: x}\n",
        "1:5: if: failure() is about the earlier steps of a run: a workflow's `if` has none",
    );
    check(
        "on: {queue: {}}\nif: branch == 'main'\nsteps:\n  - {name: a, run: x}\n",
        "2:5: if: a merge-queue workflow gates every batch and pre-flight: it takes no `if`",
    );
    let workflow = parse_ok(
        "on: {manual: {inputs: {target: x}}}\nmatrix: {os: [a, b]}\nif: env.os == 'a' || env.target != ''\nsteps:\n  - name: a\n    run: x\n    env: {OWN: y}\n    if: env.OWN == 'y' && env.KNOTLESS_EVENT == 'manual'\n",
    );
    assert_eq!(
        workflow.condition.as_ref().map(|condition| condition.text.as_str()),
        Some("env.os == 'a' || env.target != ''")
    );
}

#[test]
fn deep_conditions_are_refused_not_a_stack_overflow() {
    for deep in ["(".repeat(100_000), "!".repeat(100_000), "contains(".repeat(100_000)] {
        let error = Condition::parse(&deep, Scope::Step).expect_err("too deep");
        assert!(error.message.contains("nest more than 32 deep"), "{}", error.message);
    }
    let fine = format!("{}true{}", "(".repeat(32), ")".repeat(32));
    assert!(Condition::parse(&fine, Scope::Step).is_ok());
}

proptest::proptest! {
    /// Whatever the text, reading it ends with a condition or an error inside the text.
    #[test]
    fn any_text_reads_or_is_refused_inside_it(text in "[ -~\u{e9}\u{1f600}]{0,60}") {
        if let Err(error) = Condition::parse(&text, Scope::Step) {
            proptest::prop_assert!(error.offset <= text.len(), "{} past {}", error.offset, text.len());
            proptest::prop_assert!(text.is_char_boundary(error.offset));
        }
    }
}

#[test]
fn the_references_if_examples_parse() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/reference/workflows.md"))
        .expect("the reference");
    let line = "if: branch == 'main' && (changed('src/**') || event == 'manual')";
    assert!(text.contains(&format!("```yaml\n{line}\n```")));
    let workflow = parse_ok(&format!("on: [push, manual]\n{line}\nsteps:\n  - {{name: a, run: x}}\n"));
    let env = BTreeMap::new();
    let changed = vec!["docs/a.md".to_string()];
    let facts = Facts { event: "push", branch: "main", git_ref: "", changed: Some(&changed), env: &env, failed: false };
    assert!(workflow.skip_reason(facts, &env).is_some());
    assert!(workflow.skip_reason(Facts { event: "manual", ..facts }, &env).is_none());
    let start = text.find("```yaml\nsteps:\n  - name: build\n    run: |").expect("the steps example");
    let body = &text[start + "```yaml\n".len()..];
    let steps = parse_ok(&body[..body.find("```").expect("its end")]);
    let last = steps.steps.last().expect("a step");
    assert_eq!(last.condition.as_ref().map(|condition| condition.text.as_str()), Some("failure()"));
}

#[test]
fn services_are_read_with_their_defaults_and_bad_ones_named() {
    let workflow = parse_ok(
        "services:\n  db:\n    image: postgres:16\n    env: { POSTGRES_PASSWORD: test }\n    health: pg_isready\n    health-timeout: 2m\n  web:\n    image: busybox\n    command: [httpd, -f]\nsteps:\n  - {name: a, run: x}\n",
    );
    let names: Vec<&str> = workflow.services.iter().map(|service| service.name.as_str()).collect();
    assert_eq!(names, ["db", "web"]);
    let db = &workflow.services[0];
    assert_eq!(
        (db.image.as_str(), db.health.as_deref(), db.health_timeout_ms),
        ("postgres:16", Some("pg_isready"), 120_000)
    );
    assert_eq!(db.env.get("POSTGRES_PASSWORD").map(String::as_str), Some("test"));
    let web = &workflow.services[1];
    assert_eq!(
        (web.command.clone(), web.health.as_deref(), web.health_timeout_ms),
        (Some(vec!["httpd".to_string(), "-f".to_string()]), None, 60_000)
    );
    let with = |services: &str| format!("services:\n{services}steps:\n  - {{name: a, run: x}}\n");
    check(
        &with("  Db_1:\n    image: x\n"),
        "3:5: services.Db_1: invalid service name \"Db_1\": steps reach it by this name, so it is a host name: lowercase letters, digits and -, starting with a letter, at most 63 characters",
    );
    check(&with("  db:\n    env: {A: b}\n"), "3:5: services.db: missing field `image`");
    check(
        &with("  db:\n    image: x\n    command: []\n"),
        "3:5: services.db.command: an empty command: give the program and its arguments, or leave `command` out",
    );
    check(
        &with("  db:\n    image: x\n    ports: [5432]\n"),
        "4:5: services.db.ports: unknown field `ports`, expected one of image, command, env, health, health-timeout",
    );
    check(
        "services: {}\nsteps:\n  - {name: a, run: x}\n",
        "1:11: services: no services: name at least one, or leave `services` out",
    );
}

#[test]
fn the_references_services_example_parses() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/reference/workflows.md"))
        .expect("the reference");
    let start = text.find("```yaml\nservices:\n  web:").expect("the services example");
    let body = &text[start + "```yaml\n".len()..];
    let workflow = parse_ok(&body[..body.find("```").expect("its end")]);
    let web = &workflow.services[0];
    assert_eq!((web.name.as_str(), web.health_timeout_ms), ("web", 30_000));
}
