//! Just enough HTTP/1.1 framing for the test upstreams and the raw client: a
//! message head read line by line, a body read by `Content-Length` or chunked.
//! Hand-written on purpose: the upstreams must parse requests the way small
//! servers do (and the naive one the way it should not), and the raw client must
//! see bytes exactly as the proxy sent them, which a full HTTP library hides.

use std::io;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt};

/// The most bytes a head may have.
const MAX_HEAD: usize = 64 * 1024;

/// A start line and its header lines, as they came.
#[derive(Debug, Clone)]
pub(crate) struct Head {
    /// `POST /payments HTTP/1.1` or `HTTP/1.1 201 Created`.
    pub(crate) start: String,
    /// Names as sent (case kept), values as bytes, in order.
    pub(crate) headers: Vec<(String, Vec<u8>)>,
}

impl Head {
    /// Every value of `name` (case-insensitive), in order.
    pub(crate) fn all(&self, name: &str) -> impl Iterator<Item = &[u8]> {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    /// The first value of `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&[u8]> {
        self.all(name).next()
    }

    /// Whether a comma-separated header lists `token` (case-insensitive).
    pub(crate) fn lists(&self, name: &str, token: &str) -> bool {
        self.all(name)
            .flat_map(|v| v.split(|b| *b == b','))
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
    }

    /// `Content-Length`, when it is one number.
    pub(crate) fn content_length(&self) -> Option<usize> {
        std::str::from_utf8(self.get("content-length")?)
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Whether the body is chunked.
    pub(crate) fn chunked(&self) -> bool {
        self.lists("transfer-encoding", "chunked")
    }
}

/// Reads one head; `Ok(None)` at a clean end of stream before any byte.
pub(crate) async fn read_head<R: AsyncBufRead + Unpin>(reader: &mut R) -> io::Result<Option<Head>> {
    let mut start = None;
    let mut headers = Vec::new();
    let mut total = 0;
    loop {
        let mut line = Vec::new();
        let n = reader.read_until(b'\n', &mut line).await?;
        if n == 0 {
            return if start.is_none() && total == 0 {
                Ok(None)
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            };
        }
        total += n;
        if total > MAX_HEAD {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "head too large"));
        }
        while line.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            line.pop();
        }
        match &start {
            // Blank lines before a start line are skipped (RFC 9112 §2.2).
            None if line.is_empty() => continue,
            None => start = Some(String::from_utf8_lossy(&line).into_owned()),
            Some(_) if line.is_empty() => {
                return Ok(Some(Head {
                    start: start.unwrap_or_default(),
                    headers,
                }));
            }
            Some(_) => {
                let Some(colon) = line.iter().position(|b| *b == b':') else {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "header without ':'",
                    ));
                };
                let name = String::from_utf8_lossy(&line[..colon]).into_owned();
                let value = line[colon + 1..].trim_ascii().to_vec();
                headers.push((name, value));
            }
        }
    }
}

/// Reads exactly `length` body bytes.
pub(crate) async fn read_exact<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    length: usize,
) -> io::Result<Vec<u8>> {
    let mut body = vec![0; length];
    reader.read_exact(&mut body).await?;
    Ok(body)
}

/// Reads a chunked body (and its trailers), returning the data.
pub(crate) async fn read_chunked<R: AsyncBufRead + Unpin>(reader: &mut R) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut line = Vec::new();
        if reader.read_until(b'\n', &mut line).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let size = std::str::from_utf8(line.trim_ascii())
            .ok()
            .and_then(|text| text.split(';').next())
            .and_then(|hex| usize::from_str_radix(hex.trim(), 16).ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad chunk size"))?;
        if size == 0 {
            // Trailers, up to the blank line.
            loop {
                let mut trailer = Vec::new();
                if reader.read_until(b'\n', &mut trailer).await? == 0
                    || trailer.trim_ascii().is_empty()
                {
                    return Ok(body);
                }
            }
        }
        let start = body.len();
        body.resize(start + size, 0);
        reader.read_exact(&mut body[start..]).await?;
        let mut crlf = [0; 2];
        reader.read_exact(&mut crlf).await?;
        if &crlf != b"\r\n" {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "chunk not followed by CRLF",
            ));
        }
    }
}
