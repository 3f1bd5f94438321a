//! The MPS control protocol, spoken by gpushare itself on a daemon's `control_privileged`
//! socket (no NVIDIA client program in between), and only after the kernel has proven that the
//! socket's listener is the daemon gpushare started.
//!
//! As observed with NVIDIA's `nvidia-cuda-mps-control` (driver 535):
//! - `SOCK_SEQPACKET`; the daemon speaks first: `OUTBHELL\0` with its `SCM_CREDENTIALS`;
//! - the client answers `OUTBCRED\0` with its own credentials, then the 4-byte word `4`
//!   (gpushare sends these and its commands at once, before it reads the greeting);
//! - each command goes as an 8-byte little-endian length, then the text with its newline and a
//!   NUL (the length counts both); an 8-byte zero length ends the input;
//! - each answer is a packet of a 4-byte type `0` and text; a last packet of type `1` carries a
//!   4-byte status. Answers carry no command tag: they come in the order of the commands, and
//!   a command that has nothing to say (`set_default_device_pinned_mem_limit`,
//!   `get_server_list` without servers) sends no text.

use std::io::IoSlice;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    connect, getsockopt, recv, sendmsg, socket, sockopt, AddressFamily, ControlMessage, MsgFlags,
    SockFlag, SockType, UnixAddr, UnixCredentials,
};
use nix::sys::stat::{fstatat, Mode, SFlag};

use crate::host::mps::MpsError;
use crate::host::procinfo::ProcId;

/// The socket a root client uses.
pub const PRIVILEGED_SOCKET: &str = "control_privileged";

const HELLO: &[u8] = b"OUTBHELL\0";
const CREDENTIALS: &[u8] = b"OUTBCRED\0";
/// The word NVIDIA's client sends after its credentials.
const CLIENT_WORD: u32 = 4;
const ANSWER_TEXT: u32 = 0;
const ANSWER_END: u32 = 1;
/// The lock file, in a domain's directory, that gpushare's conversations with its daemon take
/// turns on.
pub const SESSION_LOCK: &str = "control-session.lock";
/// Largest answer packet read; longer text is cut (nothing gpushare asks for comes near).
const MAX_PACKET: usize = 64 * 1024;
/// Most answer packets one conversation reads before it calls the peer broken.
const MAX_ANSWERS: usize = 1024;

/// What the daemon said to one conversation: its text packets in order, and the final status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub lines: Vec<String>,
    pub status: u32,
}

/// Sends `commands` (one line each, no newline) to the daemon `daemon` serving `pipe`, in one
/// conversation that must be over by `timeout`.
///
/// The pipe directory is opened without following a link and the socket reached through that
/// descriptor; before a byte is sent the listener's pid (`SO_PEERCRED`, given by the kernel)
/// must be `daemon`'s, with the same start time.
///
/// # Errors
/// [`MpsError::Tampered`] when another process listens there; [`MpsError::NoAnswer`] when the
/// deadline passes; [`MpsError::Unreachable`] when nothing listens (a dead daemon's socket) or
/// the directory cannot be opened; [`MpsError::Protocol`] when the peer breaks the protocol.
pub fn converse(
    pipe: &Path,
    daemon: ProcId,
    commands: &[&str],
    timeout: Duration,
) -> Result<Answer, MpsError> {
    // NVIDIA's daemon serves one control session at a time and resets any other: gpushare's
    // own conversations with a domain (an acquire's check, gc, status, metrics) take turns on
    // a lock in the domain's directory (root's; tenants see only `pipe` and `shm`), so that
    // one of them never makes another take a healthy daemon for a hung one. A holder is done
    // within its own deadline; past twice that, go ahead without the lock.
    let _turn = pipe
        .parent()
        .and_then(|dir| crate::host::lockfile::lock_within(&dir.join(SESSION_LOCK), 2 * timeout));
    let deadline = Instant::now() + timeout;
    loop {
        match converse_once(pipe, daemon, commands, deadline, timeout) {
            // The daemon serves one control session at a time and resets any other (seen with
            // driver 535: "Cannot send command to MPS control daemon process"): tried again
            // until the deadline. The commands gpushare sends are idempotent.
            Err(MpsError::Unreachable { source, .. })
                if is_busy(&source) && Instant::now() + BUSY_PAUSE < deadline =>
            {
                std::thread::sleep(BUSY_PAUSE);
            }
            Err(MpsError::Unreachable { source, .. }) if is_busy(&source) => {
                return Err(MpsError::NoAnswer {
                    pipe: pipe.to_owned(),
                    millis: timeout.as_millis() as u64,
                })
            }
            other => return other,
        }
    }
}

/// Pause before a conversation the daemon reset (it was busy with another) is tried again.
const BUSY_PAUSE: Duration = Duration::from_millis(5);

/// Whether an error says the daemon reset the conversation (busy with another session).
fn is_busy(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ECONNRESET | libc::EPIPE))
}

/// One conversation of [`converse`], over by `deadline`.
fn converse_once(
    pipe: &Path,
    daemon: ProcId,
    commands: &[&str],
    deadline: Instant,
    timeout: Duration,
) -> Result<Answer, MpsError> {
    let unreachable = |source: Errno| MpsError::Unreachable {
        pipe: pipe.to_owned(),
        source: source.into(),
    };
    let fd = connect_proven(pipe, daemon)?;
    let c = Conversation {
        fd,
        pipe: pipe.to_owned(),
        deadline,
        timeout,
    };
    // Everything is sent at once, before the daemon's greeting is read: the listener is
    // already proven, and the daemon, woken once, reads the whole conversation from its queue
    // instead of being woken again for the rest after its greeting.
    let creds = UnixCredentials::new();
    sendmsg::<()>(
        c.fd.as_raw_fd(),
        &[IoSlice::new(CREDENTIALS)],
        &[ControlMessage::ScmCredentials(&creds)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(unreachable)?;
    c.send(&CLIENT_WORD.to_le_bytes())?;
    for cmd in commands {
        if cmd.contains(['\n', '\0']) {
            return Err(c.protocol(format!("command {cmd:?} holds a line break")));
        }
        let mut text = cmd.as_bytes().to_vec();
        text.extend_from_slice(b"\n\0");
        c.send(&(text.len() as u64).to_le_bytes())?;
        c.send(&text)?;
    }
    c.send(&0u64.to_le_bytes())?;
    let mut packet = Vec::with_capacity(MAX_PACKET);
    c.recv_packet(&mut packet)?;
    if packet != HELLO {
        return Err(c.protocol(format!("greeting {packet:?}")));
    }
    let mut lines = Vec::new();
    for _ in 0..MAX_ANSWERS {
        c.recv_packet(&mut packet)?;
        let (kind, body) = packet
            .split_first_chunk::<4>()
            .ok_or_else(|| c.protocol(format!("short answer {packet:?}")))?;
        match u32::from_le_bytes(*kind) {
            ANSWER_TEXT => {
                let text = body.strip_suffix(b"\0").unwrap_or(body);
                lines.push(String::from_utf8_lossy(text).trim_end().to_owned());
            }
            ANSWER_END => {
                let status = body
                    .first_chunk::<4>()
                    .map_or(0, |s| u32::from_le_bytes(*s));
                return Ok(Answer { lines, status });
            }
            other => return Err(c.protocol(format!("answer of type {other}"))),
        }
    }
    Err(c.protocol(format!("more than {MAX_ANSWERS} answers")))
}

/// Connects to `pipe/control_privileged` through a descriptor of `pipe` opened without
/// following a link, without blocking, and proves that the listener is `daemon`.
fn connect_proven(pipe: &Path, daemon: ProcId) -> Result<OwnedFd, MpsError> {
    let unreachable = |source: Errno| MpsError::Unreachable {
        pipe: pipe.to_owned(),
        source: source.into(),
    };
    let dir = nix::fcntl::open(
        pipe,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(unreachable)?;
    let st = fstatat(&dir, PRIVILEGED_SOCKET, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(unreachable)?;
    let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    if kind != SFlag::S_IFSOCK {
        // The daemon makes a socket there; anything else was put there by someone else.
        return Err(MpsError::Tampered {
            pipe: pipe.to_owned(),
            expected: daemon.pid,
            found: format!("a {} instead of a socket", kind_name(kind)),
        });
    }
    let fd = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )
    .map_err(unreachable)?;
    let path = format!("/proc/self/fd/{}/{PRIVILEGED_SOCKET}", dir.as_raw_fd());
    let addr = UnixAddr::new(path.as_str()).map_err(unreachable)?;
    match connect(fd.as_raw_fd(), &addr) {
        Ok(()) => {}
        // A full backlog: the listener does not accept.
        Err(Errno::EAGAIN) => {
            return Err(MpsError::NoAnswer {
                pipe: pipe.to_owned(),
                millis: 0,
            })
        }
        Err(e) => return Err(unreachable(e)),
    }
    let peer = getsockopt(&fd, sockopt::PeerCredentials).map_err(unreachable)?;
    let proven = peer.pid() == daemon.pid
        && ProcId::of(peer.pid()).is_some_and(|p| p.start_time == daemon.start_time);
    if !proven {
        return Err(MpsError::Tampered {
            pipe: pipe.to_owned(),
            expected: daemon.pid,
            found: format!("listener pid {}", peer.pid()),
        });
    }
    Ok(fd)
}

fn kind_name(kind: SFlag) -> &'static str {
    match kind {
        SFlag::S_IFLNK => "symlink",
        SFlag::S_IFREG => "file",
        SFlag::S_IFDIR => "directory",
        SFlag::S_IFIFO => "fifo",
        _ => "special file",
    }
}

/// One connected, proven conversation with its deadline.
struct Conversation {
    fd: OwnedFd,
    pipe: PathBuf,
    deadline: Instant,
    timeout: Duration,
}

impl Conversation {
    fn protocol(&self, what: String) -> MpsError {
        MpsError::Protocol {
            pipe: self.pipe.clone(),
            what,
        }
    }

    /// Waits until the socket is ready for `what`, or the deadline passes.
    fn wait(&self, what: PollFlags) -> Result<(), MpsError> {
        loop {
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(MpsError::NoAnswer {
                    pipe: self.pipe.clone(),
                    millis: self.timeout.as_millis() as u64,
                });
            }
            let ms = u16::try_from(left.as_millis() + 1).unwrap_or(u16::MAX);
            let mut fds = [PollFd::new(std::os::fd::AsFd::as_fd(&self.fd), what)];
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(0) | Err(Errno::EINTR) => {}
                Ok(_) => return Ok(()),
                Err(e) => {
                    return Err(MpsError::Unreachable {
                        pipe: self.pipe.clone(),
                        source: e.into(),
                    })
                }
            }
        }
    }

    /// Sends one packet; waits (until the deadline) only when the socket is full.
    fn send(&self, bytes: &[u8]) -> Result<(), MpsError> {
        loop {
            match nix::sys::socket::send(self.fd.as_raw_fd(), bytes, MsgFlags::MSG_NOSIGNAL) {
                Ok(_) => return Ok(()),
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => self.wait(PollFlags::POLLOUT)?,
                Err(e) => {
                    return Err(MpsError::Unreachable {
                        pipe: self.pipe.clone(),
                        source: e.into(),
                    })
                }
            }
        }
    }

    /// One packet; an end of stream is a broken protocol (the daemon always ends with type 1).
    /// Waits (until the deadline) only when nothing has come yet.
    fn recv_packet(&self, buf: &mut Vec<u8>) -> Result<(), MpsError> {
        buf.resize(MAX_PACKET, 0);
        loop {
            match recv(self.fd.as_raw_fd(), buf, MsgFlags::empty()) {
                Ok(0) => return Err(self.protocol("the daemon hung up".into())),
                Ok(n) => {
                    buf.truncate(n);
                    return Ok(());
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => self.wait(PollFlags::POLLIN)?,
                Err(e) => {
                    return Err(MpsError::Unreachable {
                        pipe: self.pipe.clone(),
                        source: e.into(),
                    })
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::mps::scripted::{Held, Scripted};

    fn me() -> ProcId {
        ProcId::of(std::process::id() as i32).unwrap()
    }

    /// A domain directory with its pipe directory, and a scripted daemon listening there.
    fn daemon(held: Held) -> (tempfile::TempDir, PathBuf, Scripted) {
        let t = tempfile::tempdir().unwrap();
        let pipe = t.path().join("pipe");
        std::fs::create_dir_all(&pipe).unwrap();
        let d = Scripted::start(&pipe, held);
        (t, pipe, d)
    }

    #[test]
    fn a_long_answer_comes_back_whole() {
        let (_t, pipe, _d) = daemon(Held::default());
        let long = "x".repeat(4000);
        let a = converse(&pipe, me(), &[&long], Duration::from_secs(5)).unwrap();
        assert_eq!(a.lines, [format!("unknown command {long}")]);
        assert_eq!(a.status, 0);
    }

    #[test]
    fn a_conversation_is_sent_whole_before_the_greeting_is_read() {
        // A daemon woken by the connection finds everything queued: it greets only after
        // reading the client's whole input, which a client waiting for the greeting first
        // would never send.
        let (_t, pipe, d) = daemon(Held {
            greets_last: true,
            ..Held::default()
        });
        let a = converse(
            &pipe,
            me(),
            &["get_default_client_priority", "get_server_list"],
            Duration::from_millis(500),
        )
        .unwrap();
        assert_eq!(a.lines, ["0"]);
        // Positive control: the daemon read the conversation and then answered it.
        assert_eq!(
            d.held.lock().unwrap().conversations,
            [vec![
                "get_default_client_priority".to_owned(),
                "get_server_list".to_owned()
            ]]
        );
    }

    #[test]
    fn a_conversation_the_daemon_resets_is_tried_again_within_the_deadline() {
        let (_t, pipe, d) = daemon(Held {
            resets: 3,
            ..Held::default()
        });
        let a = converse(&pipe, me(), &["get_server_list"], Duration::from_secs(5)).unwrap();
        assert_eq!(a.lines, Vec::<String>::new());
        let h = d.held.lock().unwrap();
        assert_eq!(h.resets, 0, "every reset was met");
        assert_eq!(h.conversations, [vec!["get_server_list".to_owned()]]);
    }

    #[test]
    fn a_daemon_that_keeps_resetting_is_no_answer_by_the_deadline() {
        let (_t, pipe, _d) = daemon(Held {
            resets: usize::MAX,
            ..Held::default()
        });
        let t0 = Instant::now();
        let e = converse(
            &pipe,
            me(),
            &["get_server_list"],
            Duration::from_millis(300),
        )
        .unwrap_err();
        assert!(matches!(e, MpsError::NoAnswer { .. }), "{e:?}");
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    }

    #[test]
    fn a_pipe_directory_swapped_for_a_link_is_not_followed() {
        let (t, real, d) = daemon(Held::default());
        let pipe = t.path().join("link");
        std::os::unix::fs::symlink(&real, &pipe).unwrap();
        let e = converse(&pipe, me(), &["get_server_list"], Duration::from_secs(2)).unwrap_err();
        assert!(matches!(e, MpsError::Unreachable { .. }), "{e:?}");
        assert!(d.held.lock().unwrap().conversations.is_empty());
        // Positive control: through the directory itself it answers.
        converse(&real, me(), &["get_server_list"], Duration::from_secs(2)).unwrap();
    }

    #[test]
    fn a_listener_is_believed_only_as_the_recorded_process() {
        let (_t, pipe, d) = daemon(Held::default());
        let reused = ProcId {
            start_time: me().start_time + 1,
            ..me()
        };
        let e = converse(&pipe, reused, &["get_server_list"], Duration::from_secs(2)).unwrap_err();
        assert!(matches!(e, MpsError::Tampered { .. }), "{e:?}");
        assert!(
            d.held.lock().unwrap().conversations.is_empty(),
            "nothing sent"
        );
    }

    #[test]
    fn what_lies_in_place_of_the_socket_is_named_and_never_opened() {
        let t = tempfile::tempdir().unwrap();
        let pipe = t.path().join("pipe");
        std::fs::create_dir_all(&pipe).unwrap();
        let at = pipe.join(PRIVILEGED_SOCKET);
        let fifo = |p: &Path| {
            nix::unistd::mkfifo(p, Mode::from_bits_truncate(0o600)).unwrap();
        };
        let file = |p: &Path| std::fs::write(p, b"").unwrap();
        let dir = |p: &Path| std::fs::create_dir(p).unwrap();
        let link = |p: &Path| std::os::unix::fs::symlink("/dev/null", p).unwrap();
        type Plant<'a> = &'a dyn Fn(&Path);
        let rows: [(&str, Plant); 4] = [
            ("a fifo", &fifo),
            ("a file", &file),
            ("a directory", &dir),
            ("a symlink", &link),
        ];
        for (what, plant) in rows {
            let _ = std::fs::remove_dir(&at);
            let _ = std::fs::remove_file(&at);
            plant(&at);
            match converse(&pipe, me(), &["get_server_list"], Duration::from_secs(2)) {
                Err(MpsError::Tampered { found, .. }) => {
                    assert_eq!(found, format!("{what} instead of a socket"));
                }
                other => panic!("{what}: {other:?}"),
            }
        }
    }

    /// A FIFO in place of the pipe directory is refused at once (an open for reading would
    /// wait for a writer).
    #[test]
    fn a_fifo_in_place_of_the_pipe_directory_is_refused_at_once() {
        let t = tempfile::tempdir().unwrap();
        let pipe = t.path().join("pipe");
        let p = pipe.clone();
        let got = crate::host::tests::beside_a_fifo(&pipe, move || {
            converse(&p, me(), &["get_server_list"], Duration::from_secs(2))
        });
        let got = got.expect("converse waited on the FIFO");
        assert!(matches!(got, Err(MpsError::Unreachable { .. })), "{got:?}");
    }

    #[test]
    fn nothing_listening_is_unreachable_at_once() {
        let t = tempfile::tempdir().unwrap();
        let pipe = t.path().join("pipe");
        std::fs::create_dir_all(&pipe).unwrap();
        // A socket nobody listens on any more (a dead daemon's).
        let s = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::empty(),
            None,
        )
        .unwrap();
        nix::sys::socket::bind(
            s.as_raw_fd(),
            &UnixAddr::new(&pipe.join(PRIVILEGED_SOCKET)).unwrap(),
        )
        .unwrap();
        drop(s);
        let t0 = Instant::now();
        let e = converse(&pipe, me(), &["get_server_list"], Duration::from_secs(4)).unwrap_err();
        assert!(matches!(e, MpsError::Unreachable { .. }), "{e:?}");
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "tried again: {:?}",
            t0.elapsed()
        );
    }
}
