//! The one place admin reports become text: human lines by default, JSON with `--json`.

use serde::Serialize;

/// A typed admin answer that renders itself for people; JSON comes from `Serialize`.
pub trait Report: Serialize {
    /// Human-readable rendering, one or more lines each ending in `\n`.
    fn human(&self) -> String;
}

/// Renders `report` as JSON (pretty) or as human text.
pub fn render(report: &impl Report, json: bool) -> String {
    if json {
        let mut s = serde_json::to_string_pretty(report).expect("reports serialise");
        s.push('\n');
        s
    } else {
        report.human()
    }
}
