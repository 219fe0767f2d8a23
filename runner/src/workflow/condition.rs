//! `if:` conditions: a small, typed expression language, checked when the workflow is read and
//! evaluated when its run (a workflow's `if`) or its step (a step's `if`) is about to start.
//!
//! ```text
//! condition := or
//! or        := and ("||" and)*
//! and       := not ("&&" not)*
//! not       := "!" not | compare
//! compare   := value (("==" | "!=") value)?
//! value     := "(" or ")" | 'string' | true | false | event | branch | ref | env.NAME
//!            | success() | failure() | always() | changed('pattern')
//!            | contains(a, b) | startsWith(a, b) | endsWith(a, b)
//! ```
//!
//! Every value is a string or a boolean, and the types are checked when the condition is read:
//! `==` compares two values of one type, `!`, `&&` and `||` take booleans, and the condition is
//! a boolean. A step's condition that names none of `success()`, `failure()` and `always()`
//! runs only while no earlier step failed, as if it began with `success() &&`.

use std::fmt;

/// A checked `if:` condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// The condition as written (without a `${{ }}` around it).
    pub text: String,
    expr: Expr,
    /// Whether it names `success()`, `failure()` or `always()`.
    checks_status: bool,
    /// Whether it names `changed()`.
    reads_changes: bool,
}

/// Where a condition stands: a workflow's `if` has no earlier steps to ask about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// A workflow's `if`.
    Workflow,
    /// A step's `if`.
    Step,
}

/// What a condition is evaluated against.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    /// `push`, `pull`, `queue` or `manual`.
    pub event: &'a str,
    /// The branch the run is for: a push's branch, a pull's target, a manual trigger's.
    pub branch: &'a str,
    /// The git ref the run checks out.
    pub git_ref: &'a str,
    /// The paths the event changed, when known; unknown (a local run, a first push, a manual
    /// trigger), `changed()` is true, as a paths filter then passes.
    pub changed: Option<&'a [String]>,
    /// The variables `env.NAME` reads; one not set reads as `''`.
    pub env: &'a std::collections::BTreeMap<String, String>,
    /// Whether an earlier step failed (not one under `continue-on-error`).
    pub failed: bool,
}

/// Why a condition does not read: a message and where in the condition (a byte offset).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionError {
    /// The byte offset in the condition as written.
    pub offset: usize,
    /// What is wrong, naming what was expected.
    pub message: String,
}

impl fmt::Display for ConditionError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.message)
    }
}

impl Condition {
    /// Reads and checks `text`.
    pub fn parse(text: &str, scope: Scope) -> Result<Condition, ConditionError> {
        let (inner, start) = unwrap_braces(text);
        let tokens = tokenize(inner, start)?;
        let mut parser = Parser {
            tokens,
            next: 0,
            end: start + inner.len(),
            scope,
            checks_status: false,
            reads_changes: false,
            depth: 0,
        };
        let expr = parser.or()?;
        if let Some(token) = parser.tokens.get(parser.next) {
            return Err(ConditionError {
                offset: token.offset,
                message: format!("expected `&&`, `||` or the end of the condition, found {}", token.kind),
            });
        }
        let ty = expr.ty();
        if ty != Type::Bool {
            return Err(ConditionError {
                offset: start,
                message: format!("a condition is true or false, found {ty}: compare it, as in branch == 'main'"),
            });
        }
        Ok(Condition {
            text: inner.trim().to_string(),
            expr,
            checks_status: parser.checks_status,
            reads_changes: parser.reads_changes,
        })
    }

    /// Whether it reads the paths the event changed (`changed()`).
    pub fn reads_changes(&self) -> bool {
        self.reads_changes
    }

    /// Whether the condition holds. A step's condition without a status function also needs
    /// that no earlier step failed.
    pub fn holds(&self, facts: &Facts<'_>) -> bool {
        let value = self.expr.eval(facts).as_bool();
        if self.checks_status { value } else { value && !facts.failed }
    }
}

/// `${{ expr }}`, as GitHub Actions users write it, is `expr`: the inside and its offset.
fn unwrap_braces(text: &str) -> (&str, usize) {
    let trimmed = text.trim_end();
    let leading = text.len() - text.trim_start().len();
    match trimmed.trim_start().strip_prefix("${{").and_then(|rest| rest.strip_suffix("}}")) {
        Some(inside) => (inside, leading + 3),
        None => (trimmed, 0),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Type {
    Bool,
    Str,
}

impl fmt::Display for Type {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(match self {
            Type::Bool => "a boolean",
            Type::Str => "a string",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Value {
    Bool(bool),
    Str(String),
}

impl Value {
    fn as_bool(&self) -> bool {
        matches!(self, Value::Bool(true))
    }

    fn into_string(self) -> String {
        match self {
            Value::Str(text) => text,
            Value::Bool(value) => value.to_string(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Expr {
    Literal(Value),
    Event,
    Branch,
    Ref,
    Env(String),
    Not(Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Equal { left: Box<Expr>, right: Box<Expr>, negated: bool },
    Success,
    Failure,
    Always,
    Changed(String),
    Text(TextTest, Box<Expr>, Box<Expr>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TextTest {
    Contains,
    StartsWith,
    EndsWith,
}

impl Expr {
    fn ty(&self) -> Type {
        match self {
            Expr::Literal(Value::Bool(_)) => Type::Bool,
            Expr::Literal(Value::Str(_)) | Expr::Event | Expr::Branch | Expr::Ref | Expr::Env(_) => Type::Str,
            _ => Type::Bool,
        }
    }

    fn eval(&self, facts: &Facts<'_>) -> Value {
        let text = |expr: &Expr| expr.eval(facts).into_string();
        match self {
            Expr::Literal(value) => value.clone(),
            Expr::Event => Value::Str(facts.event.to_string()),
            Expr::Branch => Value::Str(facts.branch.to_string()),
            Expr::Ref => Value::Str(facts.git_ref.to_string()),
            Expr::Env(name) => Value::Str(facts.env.get(name).cloned().unwrap_or_default()),
            Expr::Not(inner) => Value::Bool(!inner.eval(facts).as_bool()),
            Expr::And(left, right) => Value::Bool(left.eval(facts).as_bool() && right.eval(facts).as_bool()),
            Expr::Or(left, right) => Value::Bool(left.eval(facts).as_bool() || right.eval(facts).as_bool()),
            Expr::Equal { left, right, negated } => Value::Bool((left.eval(facts) == right.eval(facts)) != *negated),
            Expr::Success => Value::Bool(!facts.failed),
            Expr::Failure => Value::Bool(facts.failed),
            Expr::Always => Value::Bool(true),
            Expr::Changed(pattern) => Value::Bool(match facts.changed {
                Some(paths) => super::paths_match(std::slice::from_ref(pattern), paths),
                None => true,
            }),
            Expr::Text(test, haystack, needle) => {
                let (haystack, needle) = (text(haystack), text(needle));
                Value::Bool(match test {
                    TextTest::Contains => haystack.contains(&needle),
                    TextTest::StartsWith => haystack.starts_with(&needle),
                    TextTest::EndsWith => haystack.ends_with(&needle),
                })
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Name(String),
    Text(String),
    Dot,
    Comma,
    Open,
    Close,
    Not,
    And,
    Or,
    Equal,
    NotEqual,
}

impl fmt::Display for Kind {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kind::Name(name) => write!(formatter, "`{name}`"),
            Kind::Text(text) => write!(formatter, "the string {:?}", text),
            Kind::Dot => formatter.write_str("`.`"),
            Kind::Comma => formatter.write_str("`,`"),
            Kind::Open => formatter.write_str("`(`"),
            Kind::Close => formatter.write_str("`)`"),
            Kind::Not => formatter.write_str("`!`"),
            Kind::And => formatter.write_str("`&&`"),
            Kind::Or => formatter.write_str("`||`"),
            Kind::Equal => formatter.write_str("`==`"),
            Kind::NotEqual => formatter.write_str("`!=`"),
        }
    }
}

#[derive(Debug, Clone)]
struct Token {
    kind: Kind,
    offset: usize,
}

/// The tokens of `text`, whose first byte is at `base` in the condition as written.
fn tokenize(text: &str, base: usize) -> Result<Vec<Token>, ConditionError> {
    let bytes = text.as_bytes();
    let mut tokens = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let offset = base + at;
        let two = bytes.get(at..at + 2);
        let (kind, length) = match bytes[at] {
            b' ' | b'\t' | b'\n' | b'\r' => {
                at += 1;
                continue;
            }
            b'.' => (Kind::Dot, 1),
            b',' => (Kind::Comma, 1),
            b'(' => (Kind::Open, 1),
            b')' => (Kind::Close, 1),
            _ if two == Some(b"&&") => (Kind::And, 2),
            _ if two == Some(b"||") => (Kind::Or, 2),
            _ if two == Some(b"==") => (Kind::Equal, 2),
            _ if two == Some(b"!=") => (Kind::NotEqual, 2),
            b'!' => (Kind::Not, 1),
            b'\'' => {
                let mut value = String::new();
                let mut end = at + 1;
                loop {
                    match text[end..].find('\'') {
                        None => {
                            return Err(ConditionError {
                                offset,
                                message: "a string that never ends: expected a closing `'`".into(),
                            });
                        }
                        Some(quote) => {
                            value.push_str(&text[end..end + quote]);
                            end += quote + 1;
                            // `''` inside a string is one quote.
                            if bytes.get(end) == Some(&b'\'') {
                                value.push('\'');
                                end += 1;
                            } else {
                                break;
                            }
                        }
                    }
                }
                (Kind::Text(value), end - at)
            }
            byte if byte.is_ascii_alphabetic() || byte == b'_' => {
                let length = bytes[at..]
                    .iter()
                    .position(|byte| !(byte.is_ascii_alphanumeric() || *byte == b'_' || *byte == b'-'))
                    .unwrap_or(bytes.len() - at);
                (Kind::Name(text[at..at + length].to_string()), length)
            }
            b'"' => {
                return Err(ConditionError {
                    offset,
                    message: "strings are in single quotes, as in branch == 'main'".into(),
                });
            }
            _ => {
                let found = text[at..].chars().next().unwrap_or(' ');
                return Err(ConditionError {
                    offset,
                    message: format!("unexpected {found:?}: expected a value, `(`, `!`, `==`, `!=`, `&&` or `||`"),
                });
            }
        };
        tokens.push(Token { kind, offset });
        at += length;
    }
    Ok(tokens)
}

struct Parser {
    tokens: Vec<Token>,
    next: usize,
    /// The offset of the condition's end, for errors there.
    end: usize,
    scope: Scope,
    checks_status: bool,
    reads_changes: bool,
    /// How deep the `(`, `!` and calls being read nest.
    depth: usize,
}

/// How deep `(`, `!` and calls may nest: a condition is a line, and reading it must not exhaust the
/// stack whatever a workflow (a pull's, too) holds.
const MAX_DEPTH: usize = 32;

/// What a value may be, for the errors that expect one.
const A_VALUE: &str =
    "a value ('text', true, false, event, branch, ref, env.NAME, a function such as success(), or `(`)";

impl Parser {
    fn peek(&self) -> Option<&Kind> {
        self.tokens.get(self.next).map(|token| &token.kind)
    }

    fn offset(&self) -> usize {
        self.tokens.get(self.next).map(|token| token.offset).unwrap_or(self.end)
    }

    fn found(&self) -> String {
        match self.tokens.get(self.next) {
            Some(token) => token.kind.to_string(),
            None => "the end of the condition".into(),
        }
    }

    fn error<T>(&self, offset: usize, message: String) -> Result<T, ConditionError> {
        Err(ConditionError { offset, message })
    }

    fn expect(&mut self, kind: Kind) -> Result<(), ConditionError> {
        if self.peek() == Some(&kind) {
            self.next += 1;
            return Ok(());
        }
        self.error(self.offset(), format!("expected {kind}, found {}", self.found()))
    }

    fn boolean(&self, expr: &Expr, offset: usize, operator: &str) -> Result<(), ConditionError> {
        match expr.ty() {
            Type::Bool => Ok(()),
            ty => self.error(offset, format!("{operator} takes true or false, found {ty}: compare it with `==`")),
        }
    }

    fn or(&mut self) -> Result<Expr, ConditionError> {
        let start = self.offset();
        let mut left = self.and()?;
        while self.peek() == Some(&Kind::Or) {
            self.next += 1;
            self.boolean(&left, start, "`||`")?;
            let right_at = self.offset();
            let right = self.and()?;
            self.boolean(&right, right_at, "`||`")?;
            left = Expr::Or(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, ConditionError> {
        let start = self.offset();
        let mut left = self.not()?;
        while self.peek() == Some(&Kind::And) {
            self.next += 1;
            self.boolean(&left, start, "`&&`")?;
            let right_at = self.offset();
            let right = self.not()?;
            self.boolean(&right, right_at, "`&&`")?;
            left = Expr::And(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn not(&mut self) -> Result<Expr, ConditionError> {
        if self.peek() == Some(&Kind::Not) {
            self.enter()?;
            self.next += 1;
            let at = self.offset();
            let inner = self.not()?;
            self.boolean(&inner, at, "`!`")?;
            self.depth -= 1;
            return Ok(Expr::Not(Box::new(inner)));
        }
        self.compare()
    }

    /// One level deeper into `(`, `!` or a call; an error past [`MAX_DEPTH`].
    fn enter(&mut self) -> Result<(), ConditionError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return self.error(self.offset(), format!("`(`, `!` and calls nest more than {MAX_DEPTH} deep"));
        }
        Ok(())
    }

    fn compare(&mut self) -> Result<Expr, ConditionError> {
        let start = self.offset();
        let left = self.value()?;
        let negated = match self.peek() {
            Some(Kind::Equal) => false,
            Some(Kind::NotEqual) => true,
            _ => return Ok(left),
        };
        self.next += 1;
        let right_at = self.offset();
        let right = self.value()?;
        let (left_ty, right_ty) = (left.ty(), right.ty());
        if left_ty != right_ty {
            let operator = if negated { "`!=`" } else { "`==`" };
            return self.error(
                right_at.max(start),
                format!("{operator} compares two strings or two booleans, found {left_ty} and {right_ty}"),
            );
        }
        Ok(Expr::Equal { left: Box::new(left), right: Box::new(right), negated })
    }

    fn value(&mut self) -> Result<Expr, ConditionError> {
        let offset = self.offset();
        let Some(kind) = self.peek().cloned() else {
            return self.error(offset, format!("expected {A_VALUE}, found the end of the condition"));
        };
        self.next += 1;
        match kind {
            Kind::Open => {
                self.enter()?;
                let inner = self.or()?;
                self.expect(Kind::Close)?;
                self.depth -= 1;
                Ok(inner)
            }
            Kind::Text(text) => Ok(Expr::Literal(Value::Str(text))),
            Kind::Name(name) if self.peek() == Some(&Kind::Open) => {
                self.enter()?;
                let call = self.call(&name, offset)?;
                self.depth -= 1;
                Ok(call)
            }
            Kind::Name(name) => match name.as_str() {
                "true" => Ok(Expr::Literal(Value::Bool(true))),
                "false" => Ok(Expr::Literal(Value::Bool(false))),
                "event" => Ok(Expr::Event),
                "branch" => Ok(Expr::Branch),
                "ref" => Ok(Expr::Ref),
                "env" => self.variable(),
                other => self.error(
                    offset,
                    format!("unknown name `{other}`: expected true, false, event, branch, ref, env.NAME or a function"),
                ),
            },
            other => {
                self.next -= 1;
                self.error(offset, format!("expected {A_VALUE}, found {other}"))
            }
        }
    }

    fn variable(&mut self) -> Result<Expr, ConditionError> {
        self.expect(Kind::Dot)?;
        let offset = self.offset();
        match self.peek().cloned() {
            Some(Kind::Name(name)) if super::is_variable_name(&name) => {
                self.next += 1;
                Ok(Expr::Env(name))
            }
            _ => self.error(offset, format!("expected a variable name after `env.`, found {}", self.found())),
        }
    }

    fn call(&mut self, name: &str, offset: usize) -> Result<Expr, ConditionError> {
        self.expect(Kind::Open)?;
        let mut arguments = Vec::new();
        if self.peek() != Some(&Kind::Close) {
            loop {
                let at = self.offset();
                arguments.push((self.or()?, at));
                if self.peek() != Some(&Kind::Comma) {
                    break;
                }
                self.next += 1;
            }
        }
        self.expect(Kind::Close)?;
        let count = |wanted: usize, usage: &str| -> Result<(), ConditionError> {
            match arguments.len() == wanted {
                true => Ok(()),
                false => Err(ConditionError {
                    offset,
                    message: format!("{usage} takes {wanted} argument(s), found {}", arguments.len()),
                }),
            }
        };
        match name {
            "success" | "failure" | "always" => {
                count(0, &format!("{name}()"))?;
                if self.scope == Scope::Workflow {
                    return self.error(
                        offset,
                        format!("{name}() is about the earlier steps of a run: a workflow's `if` has none"),
                    );
                }
                self.checks_status = true;
                Ok(match name {
                    "success" => Expr::Success,
                    "failure" => Expr::Failure,
                    _ => Expr::Always,
                })
            }
            "changed" => {
                count(1, "changed('pattern')")?;
                match arguments.pop() {
                    Some((Expr::Literal(Value::Str(pattern)), at)) => {
                        if pattern.trim().is_empty() || pattern.starts_with('!') {
                            return self
                                .error(at, "changed() takes one path pattern, not blank and without `!`".into());
                        }
                        self.reads_changes = true;
                        Ok(Expr::Changed(pattern))
                    }
                    argument => self.error(
                        argument.map_or(offset, |(_, at)| at),
                        "changed() takes a path pattern in quotes, as in changed('docs/**')".into(),
                    ),
                }
            }
            "contains" | "startsWith" | "endsWith" => {
                count(2, &format!("{name}(text, part)"))?;
                for (argument, at) in &arguments {
                    if argument.ty() != Type::Str {
                        return self.error(*at, format!("{name}() takes strings, found {}", argument.ty()));
                    }
                }
                let test = match name {
                    "contains" => TextTest::Contains,
                    "startsWith" => TextTest::StartsWith,
                    _ => TextTest::EndsWith,
                };
                let mut arguments = arguments.into_iter().map(|(expr, _)| Box::new(expr));
                match (arguments.next(), arguments.next()) {
                    (Some(haystack), Some(needle)) => Ok(Expr::Text(test, haystack, needle)),
                    _ => self.error(offset, format!("{name}(text, part) takes 2 arguments")),
                }
            }
            other => self.error(
                offset,
                format!(
                    "unknown function {other}(): expected success(), failure(), always(), changed('pattern'), \
                     contains(text, part), startsWith(text, part) or endsWith(text, part)"
                ),
            ),
        }
    }
}
