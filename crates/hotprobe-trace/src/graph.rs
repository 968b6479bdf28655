//! `report --graph FUNC`: the call graph below a function from the
//! recorded call tree, as `uftrace graph` shows it — each distinct callee
//! path under FUNC with its calls and total time, merged over every call
//! of FUNC and every thread.

use crate::analysis::{fmt_duration, visit_threads, Progress, Step};
use crate::error::Result;
use crate::query::CompiledQuery;
use crate::reader::TraceReader;

/// One node of a call graph: a function reached by one path from a root.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GraphNode {
    /// The function's name.
    pub function: String,
    /// Calls along this path.
    pub calls: u64,
    /// Their total time (ns; calls without an exit add nothing).
    pub total_ns: u64,
    /// Calls without an exit (still running at the end of the trace).
    pub unfinished: u64,
    /// Callees, in order of first call.
    pub children: Vec<GraphNode>,
}

impl GraphNode {
    fn child(&mut self, function: &str) -> &mut GraphNode {
        let i = match self.children.iter().position(|c| c.function == function) {
            Some(i) => i,
            None => {
                self.children.push(GraphNode {
                    function: function.to_string(),
                    ..GraphNode::default()
                });
                self.children.len() - 1
            }
        };
        &mut self.children[i]
    }

    fn at_path(&mut self, path: &[String]) -> &mut GraphNode {
        match path.split_first() {
            None => self,
            Some((first, rest)) => self.child(first).at_path(rest),
        }
    }

    /// The graph as text, `uftrace graph`'s layout: total time, then
    /// `(calls) function` indented by the path.
    pub fn to_text(&self) -> String {
        let mut out = String::from("# TOTAL TIME   FUNCTION\n");
        self.write(&mut out, "", true, true);
        out
    }

    fn write(&self, out: &mut String, prefix: &str, root: bool, last: bool) {
        let branch = if root { "" } else { "+-" };
        let unfinished = match self.unfinished {
            0 => String::new(),
            n => format!(" [{n} without exit]"),
        };
        out.push_str(&format!(
            "{:>12} : {prefix}{branch}({}) {}{unfinished}\n",
            fmt_duration(self.total_ns),
            self.calls,
            self.function
        ));
        let inner = if root {
            " ".to_string()
        } else if last {
            format!("{prefix}  ")
        } else {
            format!("{prefix}| ")
        };
        for (i, c) in self.children.iter().enumerate() {
            c.write(out, &inner, false, i + 1 == self.children.len());
        }
    }
}

/// The call graph of every function `matches` accepts (one root per
/// function, sorted by name), from the calls `query` keeps.
pub fn call_graph(
    reader: &TraceReader,
    query: &CompiledQuery,
    matches: impl Fn(&str) -> bool,
    progress: Progress<'_>,
) -> Result<Vec<GraphNode>> {
    let syms = reader.symbols();
    let mut roots: Vec<GraphNode> = Vec::new();
    // The open calls of the current thread: their names, and the index in
    // the stack where the innermost open root starts.
    let mut stack: Vec<String> = Vec::new();
    let mut root_at: Option<usize> = None;
    let mut tid_now = None;
    visit_threads(reader, query, progress, |tid, step| {
        if tid_now != Some(tid) {
            tid_now = Some(tid);
            stack.clear();
            root_at = None;
        }
        let (probe, depth, leave) = match step {
            Step::Enter { probe, depth, .. } => (probe, depth, None),
            Step::Leave {
                probe,
                depth,
                start,
                end,
                leaf,
                unfinished,
                ..
            } => (
                probe,
                depth,
                Some((end.saturating_sub(start), leaf, unfinished)),
            ),
            // Hits, lost and orphan records add no call.
            _ => return,
        };
        let name = syms.name(probe).into_owned();
        let enters = !matches!(leave, Some((_, false, _)));
        if enters {
            stack.truncate(depth);
            if root_at.is_some_and(|r| r >= stack.len()) {
                root_at = None;
            }
            if root_at.is_none() && matches(&name) {
                root_at = Some(stack.len());
            }
            stack.push(name.clone());
        }
        if let Some((dur, _, unfinished)) = leave {
            if let Some(r) = root_at {
                let path = stack.get(r..).unwrap_or(&[]);
                if let Some((root_name, rest)) = path.split_first() {
                    let i = match roots.iter().position(|n| &n.function == root_name) {
                        Some(i) => i,
                        None => {
                            roots.push(GraphNode {
                                function: root_name.clone(),
                                ..GraphNode::default()
                            });
                            roots.len() - 1
                        }
                    };
                    let node = roots[i].at_path(rest);
                    node.calls += 1;
                    if unfinished {
                        node.unfinished += 1;
                    } else {
                        node.total_ns += dur;
                    }
                }
            }
            stack.truncate(depth);
            if root_at.is_some_and(|r| r >= stack.len()) {
                root_at = None;
            }
        }
    })?;
    roots.sort_by(|a, b| a.function.cmp(&b.function));
    Ok(roots)
}
