//! JSON-RPC 2.0 routes (PROTOCOL §20): an MCP server's Streamable HTTP
//! endpoint, or any API that speaks JSON-RPC over `POST`.
//!
//! The envelope's `id` names one attempt, not the operation: a client numbers
//! its requests and gives a retry a new `id`. So on such a route the `id` is
//! left out of the fingerprint (a retry is not "another body"), and a replay
//! answers with the retry's `id` — a client matches an answer to its request
//! by `id` and would drop one carrying its earlier attempt's. A batch (a JSON
//! array) is refused: its requests are several operations, which one key
//! cannot name (MCP's 2025-06-18 revision removed batches).

use bytes::Bytes;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

/// A request's `id`, as its JSON text (a string, a number or `null`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RequestId(String);

/// What a JSON-RPC route's request body is.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Envelope {
    /// One request: its `id`, `None` for a notification (or a body that is
    /// not a JSON-RPC object, which the route then treats as any body).
    Single(Option<RequestId>),
    /// An array of requests: refused (`jsonrpc-batch`).
    Batch,
}

impl Envelope {
    /// Reads `body`'s envelope: its first significant byte tells a batch, a
    /// JSON object's `id` member its id.
    pub(crate) fn of(body: &[u8]) -> Self {
        /// Only the `id` member, borrowed; the others are skipped unread.
        #[derive(serde::Deserialize)]
        struct Head<'a> {
            #[serde(borrow)]
            id: Option<&'a RawValue>,
        }
        let first = body.iter().find(|byte| !byte.is_ascii_whitespace());
        if first == Some(&b'[') {
            return Self::Batch;
        }
        let id = serde_json::from_slice::<Head<'_>>(body)
            .ok()
            .and_then(|head| head.id)
            .map(|id| RequestId(id.get().to_owned()));
        Self::Single(id)
    }
}

/// A JSON object's members in their order, each value as its JSON text: what
/// lets an answer be rewritten with nothing changed but its `id`.
struct Members(Vec<(String, Box<RawValue>)>);

impl Members {
    fn get(&self, name: &str) -> Option<&RawValue> {
        self.0
            .iter()
            .find(|(member, _)| member == name)
            .map(|(_, value)| value.as_ref())
    }

    /// Whether this is a JSON-RPC response: an `id` and a `result` or `error`.
    fn is_response(&self) -> bool {
        self.get("id").is_some() && (self.get("result").is_some() || self.get("error").is_some())
    }

    /// The object's JSON text with `id`'s value in place of its own.
    fn with_id(&self, id: &RequestId) -> String {
        let mut text = String::from("{");
        for (i, (name, value)) in self.0.iter().enumerate() {
            if i > 0 {
                text.push(',');
            }
            text.push_str(&serde_json::to_string(name).unwrap_or_default());
            text.push(':');
            text.push_str(if name == "id" { &id.0 } else { value.get() });
        }
        text.push('}');
        text
    }
}

impl<'de> Deserialize<'de> for Members {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct InOrder;
        impl<'de> Visitor<'de> for InOrder {
            type Value = Members;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry::<String, Box<RawValue>>()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(InOrder)
    }
}

/// A stored answer as the retry whose `id` is `id` must get it: a JSON-RPC
/// response — the body itself, or each event of an event stream whose data is
/// one — carries `id`; everything else (notifications, the server's own
/// requests, event ids, other bodies) is left as it is. `None`: nothing to
/// change.
pub(crate) fn answer_for(body: &[u8], event_stream: bool, id: &RequestId) -> Option<Bytes> {
    if event_stream {
        return events_for(body, id);
    }
    let members = serde_json::from_slice::<Members>(body).ok()?;
    members
        .is_response()
        .then(|| Bytes::from(members.with_id(id)))
}

/// An event stream with each JSON-RPC response in its events' data answered
/// with `id` (one `data:` line in place of the event's data lines; the other
/// fields kept, in order). Lines end in CRLF, LF or CR (the HTML standard).
fn events_for(stream: &[u8], id: &RequestId) -> Option<Bytes> {
    let mut out = Vec::with_capacity(stream.len() + 16);
    let mut event: Vec<&[u8]> = Vec::new();
    let mut changed = false;
    let mut at = 0;
    while at < stream.len() {
        let rest = &stream[at..];
        let (line_len, ending) = match rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            Some(i) if rest[i] == b'\r' && rest.get(i + 1) == Some(&b'\n') => (i, 2),
            Some(i) => (i, 1),
            None => (rest.len(), 0),
        };
        let line = &rest[..line_len];
        at += line_len + ending;
        if line.is_empty() && ending > 0 {
            changed |= write_event(&mut out, &event, id);
            out.push(b'\n');
            event.clear();
        } else {
            event.push(line);
        }
    }
    if !event.is_empty() {
        // An unfinished last event dispatches nothing: kept as it was.
        for line in &event {
            out.extend_from_slice(line);
            out.push(b'\n');
        }
    }
    changed.then(|| Bytes::from(out))
}

/// Writes one event's lines (each ended by LF), its data answered with `id`
/// when it is a JSON-RPC response; whether it was.
fn write_event(out: &mut Vec<u8>, lines: &[&[u8]], id: &RequestId) -> bool {
    let value = |line: &[u8]| -> Vec<u8> {
        let value = line.strip_prefix(b"data:").unwrap_or_default();
        value.strip_prefix(b" ").unwrap_or(value).to_vec()
    };
    let data: Vec<Vec<u8>> = lines
        .iter()
        .filter(|line| line.starts_with(b"data:"))
        .map(|line| value(line))
        .collect();
    let rewritten = serde_json::from_slice::<Members>(&data.join(&b'\n'))
        .ok()
        .filter(Members::is_response)
        .map(|members| members.with_id(id));
    let mut data_written = false;
    for line in lines {
        match &rewritten {
            Some(text) if line.starts_with(b"data:") => {
                if !data_written {
                    out.extend_from_slice(b"data: ");
                    out.extend_from_slice(text.as_bytes());
                    out.push(b'\n');
                    data_written = true;
                }
            }
            _ => {
                out.extend_from_slice(line);
                out.push(b'\n');
            }
        }
    }
    rewritten.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(text: &str) -> RequestId {
        RequestId(text.to_owned())
    }

    #[test]
    fn the_envelope_tells_a_batch_and_an_id() {
        assert_eq!(Envelope::of(b"  [{\"id\":1}]"), Envelope::Batch);
        assert_eq!(
            Envelope::of(br#"{"jsonrpc":"2.0","id":"a-1","method":"tools/call"}"#),
            Envelope::Single(Some(id("\"a-1\"")))
        );
        assert_eq!(
            Envelope::of(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            Envelope::Single(None)
        );
        assert_eq!(Envelope::of(b"not json"), Envelope::Single(None));
    }

    #[test]
    fn a_json_answer_carries_the_retrys_id_and_nothing_else_changes() {
        let stored =
            br#"{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"charged"}]}}"#;
        let answer = answer_for(stored, false, &id("7")).unwrap();
        assert_eq!(
            &answer[..],
            br#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"charged"}]}}"#
        );
        // Not a response (a notification, a plain document): untouched.
        assert!(answer_for(br#"{"jsonrpc":"2.0","method":"x"}"#, false, &id("7")).is_none());
        assert!(answer_for(b"[1,2]", false, &id("7")).is_none());
    }

    #[test]
    fn in_an_event_stream_only_the_response_is_answered_with_the_retrys_id() {
        let stored = b"event: message\r\nid: ev-1\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progress\":1}}\r\n\r\n\
event: message\nid: ev-2\ndata: {\"jsonrpc\":\"2.0\",\ndata: \"id\":3,\"result\":{}}\n\n";
        let answer = answer_for(stored, true, &id("\"r-2\"")).unwrap();
        assert_eq!(
            std::str::from_utf8(&answer).unwrap(),
            "event: message\nid: ev-1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progress\":1}}\n\n\
event: message\nid: ev-2\ndata: {\"jsonrpc\":\"2.0\",\"id\":\"r-2\",\"result\":{}}\n\n"
        );
        // No response in it: nothing to change.
        assert!(
            answer_for(
                b"data: {\"jsonrpc\":\"2.0\",\"method\":\"m\"}\n\n",
                true,
                &id("1")
            )
            .is_none()
        );
    }
}
