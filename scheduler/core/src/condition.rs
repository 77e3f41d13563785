//! Conditions: a task's `if:`, a CEL expression (the Common Expression Language, through the
//! `cel` crate) over the run's params and its upstreams' states and outputs.
//!
//! [`check`] runs at apply: it parses the expression and infers its types, so a typo in a
//! name, a task that is not upstream, a string compared with a number (outputs and params are
//! strings) or an expression that is not true or false is refused with the column, before a
//! run meets it. [`evaluate`] runs in the advance once the task's trigger rule says it runs:
//! `true` runs it, `false` makes it SKIPPED, with the expression and the values it read
//! (what `why` shows); an error (a missing output or param, `int('abc')`) fails it, naming
//! the error: a condition that cannot be judged does not silently skip work.
//!
//! The names an expression may use:
//!
//! | name                    | type   | what                                                  |
//! |-------------------------|--------|-------------------------------------------------------|
//! | `params.NAME`           | string | the run's param (an error when the run has none)      |
//! | `tasks.T.state`         | string | how direct upstream T ended: `SUCCESS`, `FAILED`, ... |
//! | `tasks.T.outputs.KEY`   | string | an output of T, a task above this one                 |
//!
//! `has(params.NAME)` and `has(tasks.T.outputs.KEY)` test for presence.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use cel::common::ast::{CallExpr, Expr, IdedExpr, LiteralValue, operators};
use cel::{Context, Program, Value};

use crate::state::InstanceState;

/// The longest `if:` accepted, in bytes: an expression is a line or two, and a bound keeps a
/// hostile file from making the apply parse megabytes.
pub const MAX_CONDITION_BYTES: usize = 4 << 10;

/// Why an expression is refused at apply: where in it (a 0-based byte offset), and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionError {
    pub offset: usize,
    pub message: String,
}

impl fmt::Display for ConditionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// What the expression of a task may read: its direct upstreams' states, and the outputs of
/// the tasks above it (`outputs_of`, a superset of `upstream`).
pub struct Scope<'a> {
    pub upstream: &'a BTreeSet<String>,
    pub outputs_of: &'a BTreeSet<String>,
}

/// A CEL type as far as [`check`] infers it. `Dyn` is anything (a comprehension's variable,
/// an element of a list): it is never refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Null,
    List,
    Map,
    /// A map whose values are strings: `params`, `tasks.T.outputs`.
    StrMap,
    Dyn,
}

impl Ty {
    fn name(self) -> &'static str {
        match self {
            Ty::Bool => "a bool",
            Ty::Int => "an int",
            Ty::Uint => "a uint",
            Ty::Double => "a double",
            Ty::String => "a string",
            Ty::Bytes => "bytes",
            Ty::Null => "null",
            Ty::List => "a list",
            Ty::Map | Ty::StrMap => "a map",
            Ty::Dyn => "any value",
        }
    }

    fn numeric(self) -> bool {
        matches!(self, Ty::Int | Ty::Uint | Ty::Double)
    }

    /// Whether values of the two types may meet in `==` or `<`: the same kind, or one is
    /// unknown.
    fn meets(self, other: Ty) -> bool {
        let map = |t: Ty| if t == Ty::StrMap { Ty::Map } else { t };
        self == Ty::Dyn
            || other == Ty::Dyn
            || map(self) == map(other)
            || (self.numeric() && other.numeric())
    }
}

/// Functions the interpreter knows, with their result type (`None`: as the argument).
const FUNCTIONS: &[(&str, Ty)] = &[
    ("size", Ty::Int),
    ("int", Ty::Int),
    ("uint", Ty::Uint),
    ("double", Ty::Double),
    ("string", Ty::String),
    ("bytes", Ty::Bytes),
    ("bool", Ty::Bool),
    ("dyn", Ty::Dyn),
    ("contains", Ty::Bool),
    ("startsWith", Ty::Bool),
    ("endsWith", Ty::Bool),
    ("matches", Ty::Bool),
];

/// Parses and type-checks `source` for a task with `scope`.
pub fn check(source: &str, scope: &Scope<'_>) -> Result<(), ConditionError> {
    if source.len() > MAX_CONDITION_BYTES {
        return Err(ConditionError {
            offset: 0,
            message: format!(
                "the expression is {} bytes (max {MAX_CONDITION_BYTES})",
                source.len()
            ),
        });
    }
    let program = compile(source)?;
    let checker = Checker {
        program: &program,
        scope,
        bound: Vec::new(),
    };
    let mut checker = checker;
    let root = program.expression();
    match checker.ty(root)? {
        Ty::Bool | Ty::Dyn => Ok(()),
        other => Err(checker.at_start(
            root,
            format!(
                "an if: must be true or false, and this is {}; compare it (== 'yes', > 0)",
                other.name()
            ),
        )),
    }
}

fn compile(source: &str) -> Result<Program, ConditionError> {
    Program::compile(source).map_err(|errors| {
        let first = errors.errors.first();
        let (line, column) = first.map_or((1, 1), |e| e.pos);
        let offset = offset_of(source, line, column);
        ConditionError {
            offset,
            message: first.map_or_else(|| "does not parse".into(), |e| syntax_message(&e.msg)),
        }
    })
}

/// The parser's message, without ANTLR's list of expected tokens.
fn syntax_message(message: &str) -> String {
    let message = message.trim();
    let message = message.strip_prefix("Syntax error: ").unwrap_or(message);
    let message = message
        .split_once(" expecting {")
        .map_or(message, |(head, _)| head);
    if message.starts_with("mismatched input '<EOF>'") {
        "syntax error: the expression ends where a value is expected".into()
    } else if message.is_empty() {
        "syntax error".into()
    } else {
        format!("syntax error: {message}")
    }
}

/// The byte offset of a 1-based (line, column) in `source`.
fn offset_of(source: &str, line: isize, column: isize) -> usize {
    let mut offset = 0;
    for (i, text) in source.split_inclusive('\n').enumerate() {
        if i as isize + 1 == line {
            let column = usize::try_from(column.max(1) - 1).unwrap_or(0);
            return (offset + column).min(source.len());
        }
        offset += text.len();
    }
    0
}

struct Checker<'a> {
    program: &'a Program,
    scope: &'a Scope<'a>,
    /// The variables of the comprehensions around the node being checked.
    bound: Vec<String>,
}

impl Checker<'_> {
    fn at(&self, node: &IdedExpr, message: String) -> ConditionError {
        let offset = self
            .program
            .source_info()
            .offset_for(node.id)
            .map_or(0, |(start, _)| start as usize);
        ConditionError { offset, message }
    }

    /// Where the text of `node` starts: a name at its first segment, a call at its function
    /// name or its receiver, an operator at its left operand.
    fn start(&self, node: &IdedExpr) -> usize {
        let offset = |n: &IdedExpr| {
            self.program
                .source_info()
                .offset_for(n.id)
                .map_or(0, |(start, _)| start as usize)
        };
        match &node.expr {
            Expr::Select(select) => self.start(&select.operand),
            Expr::Call(call) => match (&call.target, call.args.first()) {
                (Some(target), _) => self.start(target),
                (None, Some(first)) if call.func_name.starts_with(['_', '@', '!', '-']) => {
                    self.start(first).min(offset(node))
                }
                _ => offset(node).saturating_sub(call.func_name.len()),
            },
            _ => offset(node),
        }
    }

    fn at_start(&self, node: &IdedExpr, message: String) -> ConditionError {
        ConditionError {
            offset: self.start(node),
            message,
        }
    }

    fn ty(&mut self, node: &IdedExpr) -> Result<Ty, ConditionError> {
        match &node.expr {
            Expr::Literal(literal) => Ok(match literal {
                LiteralValue::Boolean(_) => Ty::Bool,
                LiteralValue::Bytes(_) => Ty::Bytes,
                LiteralValue::Double(_) => Ty::Double,
                LiteralValue::Int(_) => Ty::Int,
                LiteralValue::Null => Ty::Null,
                LiteralValue::String(_) => Ty::String,
                LiteralValue::UInt(_) => Ty::Uint,
            }),
            Expr::Ident(name) => self.name(node, &[name.as_str()]),
            Expr::Select(select) => {
                if let Some(segments) = node.expr_segments() {
                    return self.name(node, &segments);
                }
                let operand = self.ty(&select.operand)?;
                if select.test {
                    if !matches!(operand, Ty::Map | Ty::StrMap | Ty::Dyn) {
                        return Err(self.at(
                            node,
                            format!(
                                "has() tests a field of a map, and this is {}",
                                operand.name()
                            ),
                        ));
                    }
                    return Ok(Ty::Bool);
                }
                match operand {
                    Ty::StrMap => Ok(Ty::String),
                    Ty::Map | Ty::Dyn => Ok(Ty::Dyn),
                    other => Err(self.at(
                        node,
                        format!(".{} selects a field of {}", select.field, other.name()),
                    )),
                }
            }
            Expr::Call(call) => self.call(node, call),
            Expr::List(list) => {
                for element in &list.elements {
                    self.ty(element)?;
                }
                Ok(Ty::List)
            }
            Expr::Map(map) => {
                for entry in &map.entries {
                    if let cel::common::ast::EntryExpr::MapEntry(entry) = &entry.expr {
                        self.ty(&entry.key)?;
                        self.ty(&entry.value)?;
                    }
                }
                Ok(Ty::Map)
            }
            Expr::Comprehension(comprehension) => {
                self.ty(&comprehension.iter_range)?;
                self.ty(&comprehension.accu_init)?;
                self.bound.push(comprehension.iter_var.clone());
                if let Some(second) = &comprehension.iter_var2 {
                    self.bound.push(second.clone());
                }
                self.bound.push(comprehension.accu_var.clone());
                let checked = (|| {
                    self.ty(&comprehension.loop_cond)?;
                    self.ty(&comprehension.loop_step)?;
                    self.ty(&comprehension.result)
                })();
                let pushed = 2 + usize::from(comprehension.iter_var2.is_some());
                self.bound.truncate(self.bound.len() - pushed);
                checked.map(|ty| if ty == Ty::Bool { Ty::Bool } else { Ty::Dyn })
            }
            Expr::Struct(_) => Err(self.at(node, "an if: has no message types".into())),
            Expr::Unspecified => Err(self.at(node, "an empty expression".into())),
        }
    }

    /// The type of a name as written (`params.mode`, `tasks.load.outputs.rows`).
    fn name(&self, node: &IdedExpr, segments: &[&str]) -> Result<Ty, ConditionError> {
        let Some((&root, rest)) = segments.split_first() else {
            return Err(self.at_start(node, "an empty name".into()));
        };
        if self.bound.iter().any(|b| b == root) {
            return Ok(Ty::Dyn);
        }
        match (root, rest) {
            ("params", []) => Ok(Ty::StrMap),
            ("params", [_]) => Ok(Ty::String),
            ("params", [name, field, ..]) => Err(self.at_start(
                node,
                format!("params.{name} is a string: it has no field .{field}"),
            )),
            ("tasks", []) => Err(self.at_start(
                node,
                "name a task: tasks.<task>.state or tasks.<task>.outputs.<key>".into(),
            )),
            ("tasks", [task, rest @ ..]) => self.task(node, task, rest),
            _ => Err(self.at_start(
                node,
                format!("unknown name \"{root}\": an if: reads params and tasks"),
            )),
        }
    }

    fn task(&self, node: &IdedExpr, task: &str, rest: &[&str]) -> Result<Ty, ConditionError> {
        let above = self.scope.outputs_of.contains(task);
        let direct = self.scope.upstream.contains(task);
        let not_above = || {
            self.at_start(
                node,
                format!(
                    "task {task} is not upstream of this task, so it has not ended when this \
                     one is judged"
                ),
            )
        };
        match rest {
            [] | ["outputs"] | ["outputs", _] if !above => Err(not_above()),
            [] => Ok(Ty::Map),
            ["state"] if direct => Ok(Ty::String),
            ["state"] if above => Err(self.at_start(
                node,
                format!(
                    "tasks.{task}.state: task {task} is above this task but not a direct \
                     upstream; an if: reads the states of its direct upstreams"
                ),
            )),
            ["state"] => Err(not_above()),
            ["outputs"] => Ok(Ty::StrMap),
            ["outputs", _] => Ok(Ty::String),
            ["outputs", key, field, ..] => Err(self.at_start(
                node,
                format!("tasks.{task}.outputs.{key} is a string: it has no field .{field}"),
            )),
            [field, ..] => Err(self.at_start(
                node,
                format!("tasks.{task}.{field}: a task has .state and .outputs"),
            )),
        }
    }

    fn call(&mut self, node: &IdedExpr, call: &CallExpr) -> Result<Ty, ConditionError> {
        let name = call.func_name.as_str();
        let mut args = Vec::with_capacity(call.args.len() + 1);
        if let Some(target) = &call.target {
            args.push((target.as_ref(), self.ty(target)?));
        }
        for arg in &call.args {
            args.push((arg, self.ty(arg)?));
        }
        let types: Vec<Ty> = args.iter().map(|(_, ty)| *ty).collect();
        match name {
            operators::LOGICAL_AND | operators::LOGICAL_OR | operators::LOGICAL_NOT => {
                for (arg, ty) in &args {
                    if !matches!(ty, Ty::Bool | Ty::Dyn) {
                        let op = match name {
                            operators::LOGICAL_AND => "&&",
                            operators::LOGICAL_OR => "||",
                            _ => "!",
                        };
                        return Err(self.at_start(
                            arg,
                            format!("{op} needs true or false, and this is {}", ty.name()),
                        ));
                    }
                }
                Ok(Ty::Bool)
            }
            operators::NOT_STRICTLY_FALSE => Ok(Ty::Bool),
            operators::EQUALS | operators::NOT_EQUALS => {
                self.comparable(node, &args, "==")?;
                self.state_literal(&args)?;
                Ok(Ty::Bool)
            }
            operators::LESS
            | operators::LESS_EQUALS
            | operators::GREATER
            | operators::GREATER_EQUALS => {
                self.comparable(node, &args, "<")?;
                if let Some((arg, ty)) = args
                    .iter()
                    .find(|(_, ty)| matches!(ty, Ty::Bool | Ty::List | Ty::Map | Ty::StrMap))
                {
                    return Err(self.at_start(arg, format!("{} has no order", ty.name())));
                }
                Ok(Ty::Bool)
            }
            operators::ADD
            | operators::SUBSTRACT
            | operators::MULTIPLY
            | operators::DIVIDE
            | operators::MODULO
            | operators::NEGATE => {
                self.comparable(node, &args, "arithmetic")?;
                let concatenates = name == operators::ADD;
                match types.iter().copied().find(|ty| *ty != Ty::Dyn) {
                    None => Ok(Ty::Dyn),
                    Some(ty) if ty.numeric() => Ok(ty),
                    Some(ty @ (Ty::String | Ty::List | Ty::Bytes)) if concatenates => Ok(ty),
                    Some(ty) => Err(self.at(node, format!("no arithmetic on {}", ty.name()))),
                }
            }
            operators::CONDITIONAL => {
                if let Some((arg, ty)) = args.first()
                    && !matches!(ty, Ty::Bool | Ty::Dyn)
                {
                    return Err(self.at_start(
                        arg,
                        format!(
                            "the condition of ?: must be true or false, not {}",
                            ty.name()
                        ),
                    ));
                }
                Ok(match (types.get(1), types.get(2)) {
                    (Some(a), Some(b)) if a == b => *a,
                    _ => Ty::Dyn,
                })
            }
            operators::IN => {
                if let Some((arg, ty)) = args.get(1)
                    && !matches!(ty, Ty::List | Ty::Map | Ty::StrMap | Ty::Dyn)
                {
                    return Err(self.at_start(
                        arg,
                        format!("`in` needs a list or a map on its right, not {}", ty.name()),
                    ));
                }
                Ok(Ty::Bool)
            }
            operators::INDEX => match types.first() {
                Some(Ty::StrMap) => Ok(Ty::String),
                Some(Ty::List | Ty::Map | Ty::Dyn) => Ok(Ty::Dyn),
                Some(other) => Err(self.at(
                    node,
                    format!("[] indexes a list or a map, not {}", other.name()),
                )),
                None => Ok(Ty::Dyn),
            },
            _ => match FUNCTIONS.iter().find(|(known, _)| *known == name) {
                Some((_, ty)) => Ok(*ty),
                None => Err(self.at_start(
                    node,
                    format!(
                        "unknown function {name}(): an if: may call {}",
                        FUNCTIONS
                            .iter()
                            .map(|(f, _)| *f)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )),
            },
        }
    }

    /// Refuses two operands that can never be equal or ordered: a string against a number is
    /// the likely mistake, since outputs and params are strings.
    fn comparable(
        &self,
        node: &IdedExpr,
        args: &[(&IdedExpr, Ty)],
        what: &str,
    ) -> Result<(), ConditionError> {
        let [(_, a), (_, b)] = args else {
            return Ok(());
        };
        if a.meets(*b) || *a == Ty::Null || *b == Ty::Null {
            return Ok(());
        }
        let hint = if (*a == Ty::String && b.numeric()) || (*b == Ty::String && a.numeric()) {
            "; outputs and params are strings: convert with int(...) or double(...)"
        } else {
            ""
        };
        let verb = if what == "arithmetic" {
            "mixes"
        } else {
            "compares"
        };
        Err(self.at(node, format!("{verb} {} with {}{hint}", a.name(), b.name())))
    }

    /// `tasks.T.state == 'SUCESS'` can never be true: a state compared with a string literal
    /// must name a state.
    fn state_literal(&self, args: &[(&IdedExpr, Ty)]) -> Result<(), ConditionError> {
        let [(a, _), (b, _)] = args else {
            return Ok(());
        };
        for (state, literal) in [(a, b), (b, a)] {
            let is_state = state
                .expr_segments()
                .is_some_and(|s| s.len() == 3 && s[0] == "tasks" && s[2] == "state");
            if let (true, Expr::Literal(LiteralValue::String(text))) = (is_state, &literal.expr) {
                let text: &str = text.as_ref();
                if text.parse::<InstanceState>().is_err() {
                    let names: Vec<&str> = ENDED.iter().map(|s| s.as_str()).collect();
                    return Err(self.at(
                        literal,
                        format!(
                            "'{text}' is no state; an upstream ends {}",
                            names.join(", ")
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The states an upstream may have when a condition is judged.
const ENDED: [InstanceState; 6] = [
    InstanceState::Success,
    InstanceState::Failed,
    InstanceState::Timeout,
    InstanceState::Cancelled,
    InstanceState::Skipped,
    InstanceState::UpstreamFailed,
];

trait Segments {
    /// The dotted name this node spells (`tasks.load.state`), if it is one.
    fn expr_segments(&self) -> Option<Vec<&str>>;
}

impl Segments for IdedExpr {
    fn expr_segments(&self) -> Option<Vec<&str>> {
        let mut segments = Vec::new();
        let mut expr = &self.expr;
        loop {
            match expr {
                Expr::Ident(name) => {
                    segments.push(name.as_str());
                    segments.reverse();
                    return Some(segments);
                }
                Expr::Select(select) if !select.test => {
                    segments.push(select.field.as_str());
                    expr = &select.operand.expr;
                }
                _ => return None,
            }
        }
    }
}

/// What a condition reads when it is judged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    pub params: BTreeMap<String, String>,
    /// By task: its state (for direct upstreams) and its outputs.
    pub tasks: BTreeMap<String, TaskFacts>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskFacts {
    pub state: Option<InstanceState>,
    pub outputs: BTreeMap<String, String>,
}

/// A judged condition: its value, and the values of the names it read, for `why`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged {
    pub value: bool,
    /// `tasks.load.outputs.rows = "0"`, one per name read, in the expression's order.
    pub read: Vec<String>,
}

impl Judged {
    /// The line `why` shows for a condition that was false.
    pub fn skipped_because(&self, source: &str) -> String {
        if self.read.is_empty() {
            format!("if: {source} is false")
        } else {
            format!("if: {source} is false ({})", self.read.join(", "))
        }
    }
}

/// The tasks a condition reads (`tasks.T...`), each once: the advance reads their states and
/// outputs only.
pub fn tasks_read(source: &str) -> Vec<String> {
    let Ok(program) = Program::compile(source) else {
        return Vec::new();
    };
    let mut names = BTreeSet::new();
    visit_names(program.expression(), &mut |segments| {
        if let ["tasks", task, ..] = segments {
            names.insert(task.to_string());
        }
    });
    names.into_iter().collect()
}

/// Evaluates `source` on `facts`. An `Err` names why it cannot be judged.
pub fn evaluate(source: &str, facts: &Facts) -> Result<Judged, String> {
    let program = Program::compile(source).map_err(|err| format!("does not parse: {err}"))?;
    let mut context = Context::default();
    context.add_variable_from_value("params", string_map(&facts.params));
    let tasks: HashMap<String, Value> = facts
        .tasks
        .iter()
        .map(|(name, task)| {
            let mut fields: HashMap<String, Value> = HashMap::new();
            if let Some(state) = task.state {
                fields.insert("state".into(), Value::from(state.as_str().to_string()));
            }
            fields.insert("outputs".into(), string_map(&task.outputs));
            (name.clone(), Value::from(fields))
        })
        .collect();
    context.add_variable_from_value("tasks", tasks);
    let read = values_read(&program, facts);
    match program.execute(&context) {
        Ok(Value::Bool(value)) => Ok(Judged { value, read }),
        Ok(other) => Err(format!(
            "evaluated to {other:?}, not true or false ({})",
            read.join(", ")
        )),
        Err(err) => {
            let read = if read.is_empty() {
                String::new()
            } else {
                format!(" ({})", read.join(", "))
            };
            Err(format!("cannot be judged: {err}{read}"))
        }
    }
}

fn string_map(map: &BTreeMap<String, String>) -> Value {
    let map: HashMap<String, Value> = map
        .iter()
        .map(|(k, v)| (k.clone(), Value::from(v.clone())))
        .collect();
    Value::from(map)
}

/// `name = value` for each params or tasks name the program reads, in source order.
fn values_read(program: &Program, facts: &Facts) -> Vec<String> {
    let mut read: Vec<(u32, String)> = Vec::new();
    let mut seen = BTreeSet::new();
    let info = program.source_info();
    visit_named(program.expression(), &mut |node, segments| {
        let shown = match segments {
            ["params", name] => Some(facts.params.get(*name).map(|v| format!("{v:?}"))),
            ["tasks", task, "state"] => Some(
                facts
                    .tasks
                    .get(*task)
                    .and_then(|t| t.state)
                    .map(|s| format!("{:?}", s.as_str())),
            ),
            ["tasks", task, "outputs", key] => Some(
                facts
                    .tasks
                    .get(*task)
                    .and_then(|t| t.outputs.get(*key))
                    .map(|v| format!("{v:?}")),
            ),
            _ => None,
        };
        if let Some(value) = shown {
            let name = segments.join(".");
            if seen.insert(name.clone()) {
                let at = info.offset_for(node.id).map_or(0, |(start, _)| start);
                read.push((
                    at,
                    format!("{name} = {}", value.unwrap_or_else(|| "(none)".into())),
                ));
            }
        }
    });
    read.sort();
    read.into_iter().map(|(_, text)| text).collect()
}

/// Calls `f` with the segments of each dotted name in the tree (the longest spelling only).
fn visit_names(node: &IdedExpr, f: &mut dyn FnMut(&[&str])) {
    visit_named(node, &mut |_, segments| f(segments));
}

fn visit_named(node: &IdedExpr, f: &mut dyn FnMut(&IdedExpr, &[&str])) {
    if let Some(segments) = node.expr_segments() {
        f(node, &segments);
        return;
    }
    match &node.expr {
        Expr::Select(select) => {
            if select.test
                && let Some(mut segments) = select.operand.expr_segments()
            {
                segments.push(select.field.as_str());
                f(node, &segments);
                return;
            }
            visit_named(&select.operand, f);
        }
        Expr::Call(call) => {
            if let Some(target) = &call.target {
                visit_named(target, f);
            }
            for arg in &call.args {
                visit_named(arg, f);
            }
        }
        Expr::List(list) => list.elements.iter().for_each(|e| visit_named(e, f)),
        Expr::Map(map) => {
            for entry in &map.entries {
                if let cel::common::ast::EntryExpr::MapEntry(entry) = &entry.expr {
                    visit_named(&entry.key, f);
                    visit_named(&entry.value, f);
                }
            }
        }
        Expr::Comprehension(c) => {
            for part in [
                &c.iter_range,
                &c.accu_init,
                &c.loop_cond,
                &c.loop_step,
                &c.result,
            ] {
                visit_named(part, f);
            }
        }
        Expr::Ident(_) | Expr::Literal(_) | Expr::Struct(_) | Expr::Unspecified => {}
    }
}

#[cfg(test)]
mod tests;
