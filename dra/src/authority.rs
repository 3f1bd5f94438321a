//! The kubelet's gRPC clients name a unix socket's peer by the socket's path: the `:authority`
//! of their requests is e.g. `/var/lib/kubelet/plugins_registry/gpushare.io-reg.sock`, which is
//! not an HTTP authority, and the HTTP/2 server under tonic (h2) resets such a request with
//! PROTOCOL_ERROR. So every connection passes through this relay: the client's frames are
//! forwarded as they are, except header blocks, which are decoded (HPACK), their `:authority`
//! replaced by `localhost` when it is not a valid authority, and encoded again (one encoder per
//! connection, so the server's HPACK table stays in step); the server's frames go back
//! untouched.

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::net::UnixListener;
use tokio_stream::wrappers::ReceiverStream;

const PREFACE_LEN: usize = 24;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The smallest SETTINGS_MAX_FRAME_SIZE a peer may have: the relay's frames never exceed it.
const MAX_FRAME: usize = 16_384;
/// A header block larger than this is refused (the server's own limit is lower).
const MAX_BLOCK: usize = 1 << 20;

/// One relayed connection, as tonic's server reads and writes it.
pub struct Relayed(DuplexStream);

impl tonic::transport::server::Connected for Relayed {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for Relayed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Relayed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// The connections of `listener`, each through its relay.
pub fn incoming(listener: UnixListener) -> ReceiverStream<std::io::Result<Relayed>> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                () = tx.closed() => return,
            };
            let client = match accepted {
                Ok((c, _)) => c,
                Err(e) => {
                    if tx.send(Err(e)).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            let (ours, theirs) = tokio::io::duplex(64 * 1024);
            tokio::spawn(relay(client, ours));
            if tx.send(Ok(Relayed(theirs))).await.is_err() {
                return;
            }
        }
    });
    ReceiverStream::new(rx)
}

async fn relay(client: tokio::net::UnixStream, server: DuplexStream) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = tokio::io::split(server);
    let up = async {
        if let Err(e) = rewrite(&mut cr, &mut sw).await {
            tracing::debug!(error = %e, "relay: client side ended");
        }
        let _ = sw.shutdown().await;
    };
    let down = async {
        let _ = tokio::io::copy(&mut sr, &mut cw).await;
        let _ = cw.shutdown().await;
    };
    tokio::join!(up, down);
}

fn bad(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned())
}

/// A header block being collected: HEADERS flags to keep, stream, priority bytes, fragment.
struct Block {
    flags: u8,
    stream: [u8; 4],
    priority: Vec<u8>,
    fragment: Vec<u8>,
}

/// Copies the client's side to the server, header blocks rewritten.
///
/// # Errors
/// A read or write error, or a frame or header block that cannot be decoded.
pub async fn rewrite(
    r: &mut (impl AsyncRead + Unpin),
    w: &mut (impl AsyncWrite + Unpin),
) -> std::io::Result<()> {
    let mut preface = [0u8; PREFACE_LEN];
    r.read_exact(&mut preface).await?;
    w.write_all(&preface).await?;
    let mut decoder = loona_hpack::Decoder::new();
    let mut encoder = loona_hpack::Encoder::new();
    let mut block: Option<Block> = None;
    loop {
        let mut head = [0u8; 9];
        match r.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        let mut payload = vec![0u8; len];
        r.read_exact(&mut payload).await?;
        match kind {
            HEADERS if block.is_none() => {
                let mut p = payload.as_slice();
                let mut pad = 0;
                if flags & PADDED != 0 {
                    pad = usize::from(*p.first().ok_or_else(|| bad("empty padded HEADERS"))?);
                    p = &p[1..];
                }
                let mut priority = Vec::new();
                if flags & PRIORITY != 0 {
                    priority = p
                        .get(..5)
                        .ok_or_else(|| bad("short HEADERS priority"))?
                        .to_vec();
                    p = &p[5..];
                }
                let end = p
                    .len()
                    .checked_sub(pad)
                    .ok_or_else(|| bad("HEADERS padding"))?;
                block = Some(Block {
                    flags: flags & (END_STREAM | PRIORITY),
                    stream: [head[5], head[6], head[7], head[8]],
                    priority,
                    fragment: p[..end].to_vec(),
                });
            }
            CONTINUATION if block.is_some() => {
                let b = block.as_mut().expect("checked");
                b.fragment.extend_from_slice(&payload);
                if b.fragment.len() > MAX_BLOCK {
                    return Err(bad("header block too large"));
                }
            }
            _ => {
                if block.is_some() {
                    return Err(bad("a frame inside a header block"));
                }
                w.write_all(&head).await?;
                w.write_all(&payload).await?;
                continue;
            }
        }
        if flags & END_HEADERS != 0 {
            let b = block.take().expect("a block is open");
            let out = reencode(&mut decoder, &mut encoder, &b.fragment)?;
            write_block(w, &b, &out).await?;
        }
    }
}

/// The block decoded, its `:authority` made valid, and encoded again.
fn reencode(
    decoder: &mut loona_hpack::Decoder<'_>,
    encoder: &mut loona_hpack::Encoder<'_>,
    fragment: &[u8],
) -> std::io::Result<Vec<u8>> {
    let mut headers = decoder
        .decode(fragment)
        .map_err(|e| bad(&format!("HPACK: {e:?}")))?;
    for (name, value) in &mut headers {
        if name.as_slice() == b":authority"
            && http::uri::Authority::try_from(value.as_slice()).is_err()
        {
            *value = b"localhost".to_vec();
        }
    }
    Ok(encoder.encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice()))))
}

async fn write_block(
    w: &mut (impl AsyncWrite + Unpin),
    b: &Block,
    block: &[u8],
) -> std::io::Result<()> {
    let first_room = MAX_FRAME - b.priority.len();
    let (first, mut rest) = block.split_at(block.len().min(first_room));
    let frame = |kind: u8, flags: u8, parts: &[&[u8]]| {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let mut f = Vec::with_capacity(9 + len);
        f.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
        f.extend_from_slice(&b.stream);
        for p in parts {
            f.extend_from_slice(p);
        }
        f
    };
    let end = if rest.is_empty() { END_HEADERS } else { 0 };
    w.write_all(&frame(HEADERS, b.flags | end, &[&b.priority, first]))
        .await?;
    while !rest.is_empty() {
        let (chunk, more) = rest.split_at(rest.len().min(MAX_FRAME));
        rest = more;
        let end = if rest.is_empty() { END_HEADERS } else { 0 };
        w.write_all(&frame(CONTINUATION, end, &[chunk])).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client's connection: the preface, a SETTINGS frame, and HEADERS (split into a
    /// CONTINUATION) whose :authority is a socket path, then a DATA frame.
    fn client_bytes(enc: &mut loona_hpack::Encoder<'_>) -> Vec<u8> {
        let block = enc.encode([
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", b"/pluginregistration.Registration/GetInfo"),
            (
                b":authority",
                b"/var/lib/kubelet/plugins_registry/gpushare.io-reg.sock",
            ),
            (b"content-type", b"application/grpc"),
        ]);
        let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        out.extend_from_slice(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
        let (a, b) = block.split_at(10);
        let f = |kind: u8, flags: u8, p: &[u8]| {
            let mut v = vec![0, 0, p.len() as u8, kind, flags, 0, 0, 0, 1];
            v.extend_from_slice(p);
            v
        };
        out.extend(f(HEADERS, 0, a));
        out.extend(f(CONTINUATION, END_HEADERS, b));
        out.extend(f(0x0, END_STREAM, &[0, 0, 0, 0, 0]));
        out
    }

    #[tokio::test]
    async fn a_socket_path_authority_becomes_localhost_and_the_rest_is_kept() {
        let mut enc = loona_hpack::Encoder::new();
        let input = client_bytes(&mut enc);
        let mut out = Vec::new();
        rewrite(&mut input.as_slice(), &mut out).await.unwrap();
        assert_eq!(&out[..24], b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        assert_eq!(
            &out[24..33],
            &[0, 0, 0, 0x4, 0, 0, 0, 0, 0],
            "SETTINGS kept"
        );
        let len = usize::from(out[35]) | usize::from(out[34]) << 8;
        assert_eq!(
            (out[36], out[37]),
            (HEADERS, END_HEADERS),
            "one HEADERS frame"
        );
        assert_eq!(&out[38..42], &[0, 0, 0, 1], "same stream");
        let headers = loona_hpack::Decoder::new()
            .decode(&out[42..42 + len])
            .unwrap();
        let get = |n: &[u8]| {
            headers
                .iter()
                .find(|(k, _)| k.as_slice() == n)
                .map(|(_, v)| v.as_slice())
        };
        assert_eq!(get(b":authority"), Some(&b"localhost"[..]));
        assert_eq!(
            get(b":path"),
            Some(&b"/pluginregistration.Registration/GetInfo"[..])
        );
        assert_eq!(headers.len(), 5);
        assert_eq!(
            &out[42 + len..],
            &[0, 0, 5, 0, END_STREAM, 0, 0, 0, 1, 0, 0, 0, 0, 0]
        );
    }

    #[tokio::test]
    async fn a_valid_authority_is_left_alone() {
        let mut enc = loona_hpack::Encoder::new();
        let block = enc.encode([(&b":authority"[..], &b"localhost:1234"[..])]);
        let mut input = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        input.extend_from_slice(&[0, 0, block.len() as u8, HEADERS, END_HEADERS, 0, 0, 0, 3]);
        input.extend_from_slice(&block);
        let mut out = Vec::new();
        rewrite(&mut input.as_slice(), &mut out).await.unwrap();
        let headers = loona_hpack::Decoder::new().decode(&out[33..]).unwrap();
        assert_eq!(
            headers,
            [(b":authority".to_vec(), b"localhost:1234".to_vec())]
        );
    }
}
