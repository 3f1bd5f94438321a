//! A scripted MPS control daemon, for tests: it listens on a domain's `control_privileged`
//! socket in this very process (so a conversation proves it as the recorded daemon, this
//! process), speaks the control protocol as `protocol` documents NVIDIA's daemon speaking it,
//! and keeps the settings a GPU's daemon and its servers would: the defaults, and the active
//! thread percentage and pinned memory limit of each server in its list.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use nix::sys::socket::{
    accept, bind, listen, recv, send, socket, AddressFamily, Backlog, MsgFlags, SockFlag, SockType,
    UnixAddr,
};

use crate::host::mps::protocol::PRIVILEGED_SOCKET;

/// Thread percentage and pinned memory limit (MiB; `None`: unset) of the daemon's defaults or
/// of one server.
pub type Set = (u32, Option<u64>);

/// What the scripted daemon holds.
#[derive(Debug, Default)]
pub struct Held {
    pub defaults: Set,
    pub priority: u32,
    /// Servers by pid.
    pub servers: BTreeMap<u32, Set>,
    /// Servers that take no setting (their sets are answered, and change nothing).
    pub stuck: Vec<u32>,
    /// The commands of each conversation, in order.
    pub conversations: Vec<Vec<String>>,
    /// How many connections, from the next, to reset right after the greeting (as the daemon
    /// does to a session while it serves another).
    pub resets: usize,
    /// Greets only once the client's whole input is queued (a client that waits for the
    /// greeting before it sends then never gets one).
    pub greets_last: bool,
}

/// A running scripted daemon; stopped when dropped.
pub struct Scripted {
    pub held: Arc<Mutex<Held>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Scripted {
    /// Listens in `pipe` (which must exist) holding `held`.
    pub fn start(pipe: &Path, held: Held) -> Self {
        let listener = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )
        .unwrap();
        let addr = UnixAddr::new(&pipe.join(PRIVILEGED_SOCKET)).unwrap();
        bind(listener.as_raw_fd(), &addr).unwrap();
        listen(&listener, Backlog::new(8).unwrap()).unwrap();
        let held = Arc::new(Mutex::new(held));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (held, stop) = (held.clone(), stop.clone());
            std::thread::spawn(move || serve(&listener, &held, &stop))
        };
        Self {
            held,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Scripted {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(listener: &OwnedFd, held: &Mutex<Held>, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        match accept(listener.as_raw_fd()) {
            Ok(fd) => {
                let fd = Accepted(fd);
                let _ = converse(&fd, held);
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(2)),
        }
    }
}

/// A descriptor `accept` returned (blocking: accept(2) does not pass the listener's
/// `O_NONBLOCK` on), closed when dropped.
struct Accepted(RawFd);

impl Drop for Accepted {
    fn drop(&mut self) {
        let _ = nix::unistd::close(self.0);
    }
}

/// One packet, blocking (the accepted socket is blocking).
fn packet(fd: &Accepted) -> nix::Result<Vec<u8>> {
    let mut buf = vec![0u8; 64 * 1024];
    let n = recv(fd.0, &mut buf, MsgFlags::empty())?;
    buf.truncate(n);
    Ok(buf)
}

fn converse(fd: &Accepted, held: &Mutex<Held>) -> nix::Result<()> {
    const HELLO: &[u8] = b"OUTBHELL\0";
    let greets_last = held.lock().unwrap().greets_last;
    let commands = if greets_last {
        let commands = input(fd)?;
        send(fd.0, HELLO, MsgFlags::MSG_NOSIGNAL)?;
        commands
    } else {
        send(fd.0, HELLO, MsgFlags::MSG_NOSIGNAL)?;
        {
            let mut h = held.lock().unwrap();
            if h.resets > 0 {
                h.resets -= 1;
                return Ok(());
            }
        }
        input(fd)?
    };
    let mut h = held.lock().unwrap();
    for c in &commands {
        for line in answer(&mut h, c) {
            let mut p = 0u32.to_le_bytes().to_vec();
            p.extend_from_slice(line.as_bytes());
            p.push(0);
            send(fd.0, &p, MsgFlags::MSG_NOSIGNAL)?;
        }
    }
    h.conversations.push(commands);
    drop(h);
    let mut end = 1u32.to_le_bytes().to_vec();
    end.extend_from_slice(&0u32.to_le_bytes());
    send(fd.0, &end, MsgFlags::MSG_NOSIGNAL)?;
    Ok(())
}

/// The client's credentials, its word and its commands, to the end of its input.
fn input(fd: &Accepted) -> nix::Result<Vec<String>> {
    packet(fd)?; // OUTBCRED
    packet(fd)?; // the client's word
    let mut commands = Vec::new();
    loop {
        let len = packet(fd)?;
        if len.iter().all(|b| *b == 0) {
            return Ok(commands);
        }
        let text = packet(fd)?;
        let text = String::from_utf8_lossy(&text);
        commands.push(text.trim_end_matches(['\n', '\0']).to_owned());
    }
}

/// A pinned limit as NVIDIA's daemon prints it (`2G`, `512M`); nothing when unset.
fn pinned(m: Option<u64>) -> Vec<String> {
    match m {
        Some(m) if m % 1024 == 0 => vec![format!("{}G", m / 1024)],
        Some(m) => vec![format!("{m}M")],
        None => vec![],
    }
}

fn mib(arg: &str) -> Option<u64> {
    arg.strip_suffix('M')?.parse().ok().filter(|m| *m > 0)
}

/// The text lines the daemon answers `command` with, changing what it holds.
fn answer(h: &mut Held, command: &str) -> Vec<String> {
    let w: Vec<&str> = command.split_whitespace().collect();
    let server = |w: &[&str]| w.get(1).and_then(|p| p.parse::<u32>().ok());
    match w.as_slice() {
        ["get_server_list"] => h.servers.keys().map(u32::to_string).collect(),
        ["set_default_active_thread_percentage", v] => {
            h.defaults.0 = v.parse().unwrap();
            vec![format!("{v}.0")]
        }
        ["set_default_device_pinned_mem_limit", "0", m] => {
            h.defaults.1 = mib(m);
            vec![]
        }
        ["set_default_client_priority", p] => {
            h.priority = p.parse().unwrap();
            vec![]
        }
        ["get_default_active_thread_percentage"] => vec![format!("{}.0", h.defaults.0)],
        ["get_default_device_pinned_mem_limit", "0"] => pinned(h.defaults.1),
        ["get_default_client_priority"] => vec![h.priority.to_string()],
        ["set_active_thread_percentage", _, v] => {
            let pid = server(&w).unwrap();
            if !h.stuck.contains(&pid) {
                if let Some(s) = h.servers.get_mut(&pid) {
                    s.0 = v.parse().unwrap();
                }
            }
            vec![format!("{v}.0")]
        }
        ["set_device_pinned_mem_limit", _, "0", m] => {
            let pid = server(&w).unwrap();
            if !h.stuck.contains(&pid) {
                if let Some(s) = h.servers.get_mut(&pid) {
                    s.1 = mib(m);
                }
            }
            vec![]
        }
        ["get_active_thread_percentage", _] => h
            .servers
            .get(&server(&w).unwrap())
            .map_or_else(Vec::new, |s| vec![format!("{}.0", s.0)]),
        ["get_device_pinned_mem_limit", _, "0"] => h
            .servers
            .get(&server(&w).unwrap())
            .map_or_else(Vec::new, |s| pinned(s.1)),
        _ => vec![format!("unknown command {command}")],
    }
}
