//! The byte streams a phone's MQTT session runs over: TCP, TLS over TCP, and MQTT over
//! WebSocket (`/mqtt`, subprotocol `mqtt`, for networks that pass only 443). The session reads
//! and writes bytes; only WebSocket needs adapting (one MQTT packet may span frames, one frame may
//! carry several packets).

use bytes::{Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use std::future::Future;
use std::io;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{header, HeaderValue, StatusCode};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// WebSocket path of MQTT over WebSocket.
pub const PATH: &str = "/mqtt";
/// The WebSocket subprotocol MQTT clients ask for.
pub const SUBPROTOCOL: &str = "mqtt";

/// What a session needs of its connection. Reads must be cancel-safe: the session races them
/// against its timers.
pub trait Transport: Send + Sync {
    /// Appends what has arrived to `out`; `Ok(0)` when the peer closed. `out` is usually empty
    /// and unallocated: an idle connection holds no buffer.
    fn read_into<'a>(
        &'a mut self,
        out: &'a mut BytesMut,
    ) -> impl Future<Output = io::Result<usize>> + Send + 'a;
    /// Writes one or more whole MQTT packets.
    fn write<'a>(&'a mut self, data: &'a [u8]) -> impl Future<Output = io::Result<()>> + Send + 'a;
    /// Closes politely (TLS close_notify, WebSocket close frame).
    fn close(&mut self) -> impl Future<Output = ()> + Send + '_;
}

/// Bytes read per call where a read needs a buffer while it waits (TLS). A point's PUBLISH is
/// about 110 bytes; larger packets are assembled over several reads.
const CHUNK: usize = 256;

/// Plain TCP: waits for readiness with no buffer, then reads into one on the stack, so that an
/// idle phone's task holds no read buffer at all. `poll_read_ready` rather than `readable()`:
/// the latter's future carries its own waiter node (152 bytes here) in every idle task.
pub(crate) struct Tcp(pub TcpStream);

impl Transport for Tcp {
    async fn read_into(&mut self, out: &mut BytesMut) -> io::Result<usize> {
        loop {
            std::future::poll_fn(|cx| self.0.poll_read_ready(cx)).await?;
            let mut chunk = [0u8; 2048];
            let mut got = 0;
            let read = self.0.try_io(Interest::READABLE, || {
                got = std::io::Read::read(&mut &*socket2::SockRef::from(&self.0), &mut chunk)?;
                short_read_drained(got, chunk.len())
            });
            match read {
                Ok(n) => {
                    out.extend_from_slice(&chunk[..n]);
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && got > 0 => {
                    out.extend_from_slice(&chunk[..got]);
                    return Ok(got);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
    }

    async fn write(&mut self, data: &[u8]) -> io::Result<()> {
        self.0.write_all(data).await
    }

    async fn close(&mut self) {
        let _ = self.0.shutdown().await;
    }
}

/// What a read of `n` bytes into a buffer of `len` tells tokio. A short read (0 < n < len) took
/// everything the socket held, so it is reported as "would block" (the bytes are kept by the
/// caller): tokio then clears the socket's readiness at once, where a plain read left it set and
/// the next read made one more `recv` only to learn EAGAIN, a system call per point for a phone
/// sending one point at a time. Data that arrives meanwhile raises readiness again (tokio clears
/// only the readiness it saw before the read).
fn short_read_drained(n: usize, len: usize) -> io::Result<usize> {
    if n > 0 && n < len {
        Err(io::ErrorKind::WouldBlock.into())
    } else {
        Ok(n)
    }
}

/// A byte stream that needs a buffer to read into: TLS over TCP.
pub(crate) struct Stream<T>(pub T);

impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync> Transport for Stream<T> {
    async fn read_into(&mut self, out: &mut BytesMut) -> io::Result<usize> {
        let mut chunk = [0u8; CHUNK];
        let n = self.0.read(&mut chunk).await?;
        out.extend_from_slice(&chunk[..n]);
        Ok(n)
    }

    async fn write(&mut self, data: &[u8]) -> io::Result<()> {
        self.0.write_all(data).await?;
        self.0.flush().await
    }

    async fn close(&mut self) {
        let _ = self.0.shutdown().await;
    }
}

/// MQTT over WebSocket: binary frames carry the MQTT bytes.
pub(crate) struct Ws<S> {
    ws: WebSocketStream<S>,
}

impl<S> Ws<S> {
    pub(crate) fn new(ws: WebSocketStream<S>) -> Self {
        Ws { ws }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + Sync> Transport for Ws<S> {
    async fn read_into(&mut self, out: &mut BytesMut) -> io::Result<usize> {
        loop {
            // `next()` is cancel-safe: a frame is either returned or still in the stream.
            match self.ws.next().await {
                Some(Ok(Message::Binary(b))) if !b.is_empty() => {
                    out.extend_from_slice(&b);
                    return Ok(b.len());
                }
                Some(Ok(Message::Binary(_))) => {}
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                Some(Ok(Message::Text(_))) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "MQTT over WebSocket is binary",
                    ))
                }
                Some(Ok(Message::Close(_))) | None => return Ok(0),
                Some(Err(e)) => return Err(io::Error::other(e)),
            }
        }
    }

    async fn write(&mut self, data: &[u8]) -> io::Result<()> {
        self.ws
            .send(Message::Binary(Bytes::copy_from_slice(data)))
            .await
            .map_err(io::Error::other)
    }

    async fn close(&mut self) {
        let _ = self.ws.close(None).await;
    }
}

/// Small buffers: an edge holds tens of thousands of mostly idle connections.
pub(crate) fn ws_config(max_packet: usize) -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(4096)
        .write_buffer_size(0)
        .max_message_size(Some(max_packet * 2))
        .max_frame_size(Some(max_packet * 2))
}

/// The WebSocket handshake check: path `/mqtt`, subprotocol `mqtt` offered (and chosen). The
/// large error type is tungstenite's callback signature.
#[allow(clippy::result_large_err)]
pub(crate) fn check_upgrade(req: &Request, mut resp: Response) -> Result<Response, ErrorResponse> {
    let refuse = |status: StatusCode, why: &str| {
        let mut r = ErrorResponse::new(Some(why.to_string()));
        *r.status_mut() = status;
        r
    };
    if req.uri().path() != PATH {
        return Err(refuse(StatusCode::NOT_FOUND, "not found: MQTT is on /mqtt"));
    }
    let offers_mqtt = req
        .headers()
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim().eq_ignore_ascii_case(SUBPROTOCOL));
    if !offers_mqtt {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "the WebSocket subprotocol must be mqtt",
        ));
    }
    resp.headers_mut().insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static(SUBPROTOCOL),
    );
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_read_clears_readiness_and_a_full_or_empty_one_does_not() {
        assert_eq!(
            short_read_drained(110, 2048).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        assert_eq!(short_read_drained(2048, 2048).unwrap(), 2048);
        assert_eq!(short_read_drained(0, 2048).unwrap(), 0);
    }

    fn req(path: &str, proto: Option<&str>) -> Request {
        let mut b = Request::builder().uri(path);
        if let Some(p) = proto {
            b = b.header(header::SEC_WEBSOCKET_PROTOCOL, p);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn upgrade_needs_the_path_and_the_mqtt_subprotocol() {
        let ok = check_upgrade(&req("/mqtt", Some("mqttv3.1, mqtt")), Response::new(())).unwrap();
        assert_eq!(ok.headers()[header::SEC_WEBSOCKET_PROTOCOL], "mqtt");
        for (path, proto, status) in [
            ("/", Some("mqtt"), StatusCode::NOT_FOUND),
            ("/mqtt", None, StatusCode::BAD_REQUEST),
            ("/mqtt", Some("chat"), StatusCode::BAD_REQUEST),
        ] {
            assert_eq!(
                check_upgrade(&req(path, proto), Response::new(()))
                    .unwrap_err()
                    .status(),
                status
            );
        }
    }
}
