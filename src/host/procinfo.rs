//! Process identity: a pid plus its start time, so that a reused pid is not taken for a live one.

use serde::{Deserialize, Serialize};

/// A process as recorded in state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcId {
    pub pid: i32,
    /// Start time in clock ticks since boot (field 22 of `/proc/<pid>/stat`).
    pub start_time: u64,
}

impl ProcId {
    /// Identifies a running process, `None` when it does not exist.
    pub fn of(pid: i32) -> Option<Self> {
        start_time(pid).map(|start_time| Self { pid, start_time })
    }

    /// Whether this very process (same pid and start time) is still there and not a zombie.
    pub fn is_alive(&self) -> bool {
        match stat(self.pid) {
            Some((state, st)) => st == self.start_time && state != 'Z' && state != 'X',
            None => false,
        }
    }
}

/// Start time of `pid` in clock ticks since boot.
pub fn start_time(pid: i32) -> Option<u64> {
    stat(pid).map(|(_, st)| st)
}

/// (state letter, start time) from `/proc/<pid>/stat`.
fn stat(pid: i32) -> Option<(char, u64)> {
    if pid <= 0 {
        return None;
    }
    let text = crate::host::small_file::read_text(format!("/proc/{pid}/stat"), 4096).ok()?;
    // The command name is in parentheses and may contain spaces or ')': split after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    // After ')' come fields 3.. ; start time is field 22, i.e. the 20th here (state is 3rd).
    let st = fields.nth(18)?.parse().ok()?;
    Some((state, st))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_is_alive_and_reuse_is_not() {
        let me = ProcId::of(std::process::id() as i32).unwrap();
        assert!(me.is_alive());
        let reused = ProcId {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(!reused.is_alive());
        assert!(!ProcId {
            pid: -1,
            start_time: 0
        }
        .is_alive());
        assert!(ProcId::of(i32::MAX).is_none());
    }

    #[test]
    fn exited_child_is_not_alive() {
        let mut c = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let id = ProcId::of(c.id() as i32).expect("a child not yet reaped has a /proc entry");
        assert!(
            id.is_alive(),
            "positive control: the running child is alive"
        );
        c.kill().unwrap();
        c.wait().unwrap();
        assert!(!id.is_alive(), "reaped");
    }
}
