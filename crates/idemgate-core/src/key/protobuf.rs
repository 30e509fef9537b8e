//! A key in a gRPC request's message, read without its schema: the string at a
//! top-level field number (AIP-155's `request_id`, PROTOCOL §22).
//!
//! Why a field number and not a descriptor set: the protobuf wire format says
//! where every field starts and ends without knowing its type (each field is a
//! number and a wire type), so one number is all a route needs to name — no
//! `.proto` files or descriptor sets to ship beside the proxy and keep in step
//! with the service. What the number cannot reach is a field inside a nested
//! message; AIP-155's `request_id` is top-level by its definition.

/// Why a gRPC body's key field could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unreadable {
    /// The body is not one length-prefixed gRPC message: none, several (a
    /// streaming call), or one cut short.
    NotOneMessage,
    /// The message breaks the wire format.
    Malformed,
    /// The message is compressed (`grpc-encoding`): its fields are not readable
    /// without decompressing it.
    Compressed,
    /// The field holds a number, not a string.
    NotAString,
}

/// The string (or bytes) at top-level field `number` of the one message in a
/// gRPC request body — the last occurrence, as protobuf parsers take it;
/// `Ok(None)` when the message does not have the field.
pub(crate) fn string_field(body: &[u8], number: u32) -> Result<Option<&[u8]>, Unreadable> {
    let [flag, a, b, c, d, message @ ..] = body else {
        return Err(Unreadable::NotOneMessage);
    };
    match flag {
        0 => {}
        1 => return Err(Unreadable::Compressed),
        _ => return Err(Unreadable::Malformed),
    }
    if u32::from_be_bytes([*a, *b, *c, *d]) as usize != message.len() {
        return Err(Unreadable::NotOneMessage);
    }
    let mut rest = message;
    let mut found = None;
    while !rest.is_empty() {
        let tag = varint(&mut rest).ok_or(Unreadable::Malformed)?;
        let field = u32::try_from(tag >> 3).map_err(|_| Unreadable::Malformed)?;
        let wire_type = tag & 7;
        // What a string field could be: a length-delimited value; `None` for
        // the numbers (varint, fixed64, fixed32), skipped.
        let value = match wire_type {
            0 => {
                varint(&mut rest).ok_or(Unreadable::Malformed)?;
                None
            }
            1 => {
                take(&mut rest, 8)?;
                None
            }
            2 => {
                let len = varint(&mut rest).ok_or(Unreadable::Malformed)?;
                let len = usize::try_from(len).map_err(|_| Unreadable::Malformed)?;
                Some(take(&mut rest, len)?)
            }
            5 => {
                take(&mut rest, 4)?;
                None
            }
            // Groups (3, 4) are long deprecated, and no other type exists.
            _ => return Err(Unreadable::Malformed),
        };
        if field == number {
            found = Some(value.ok_or(Unreadable::NotAString)?);
        }
    }
    Ok(found)
}

/// The next `len` bytes of `rest`.
fn take<'a>(rest: &mut &'a [u8], len: usize) -> Result<&'a [u8], Unreadable> {
    if rest.len() < len {
        return Err(Unreadable::Malformed);
    }
    let (taken, after) = rest.split_at(len);
    *rest = after;
    Ok(taken)
}

/// A base-128 varint (at most 10 bytes).
fn varint(rest: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for (i, &byte) in rest.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            *rest = &rest[i + 1..];
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `fields` as one uncompressed gRPC message.
    fn framed(fields: &[u8]) -> Vec<u8> {
        let mut body = vec![0];
        body.extend_from_slice(&(fields.len() as u32).to_be_bytes());
        body.extend_from_slice(fields);
        body
    }

    #[test]
    fn the_string_at_a_field_number_is_found_past_other_fields() {
        // field 2 varint 300, field 3 fixed32, field 1 "req-7", field 4 fixed64
        let message = [
            0x10, 0xac, 0x02, 0x1d, 1, 2, 3, 4, 0x0a, 5, b'r', b'e', b'q', b'-', b'7', 0x21, 0, 0,
            0, 0, 0, 0, 0, 0,
        ];
        let body = framed(&message);
        assert_eq!(string_field(&body, 1), Ok(Some(&b"req-7"[..])));
        assert_eq!(string_field(&body, 9), Ok(None));
        assert_eq!(string_field(&body, 2), Err(Unreadable::NotAString));
    }

    #[test]
    fn the_last_occurrence_wins_as_parsers_take_it() {
        let body = framed(&[0x0a, 1, b'a', 0x0a, 1, b'b']);
        assert_eq!(string_field(&body, 1), Ok(Some(&b"b"[..])));
    }

    #[test]
    fn broken_or_compressed_messages_are_refused() {
        assert_eq!(string_field(b"", 1), Err(Unreadable::NotOneMessage));
        let mut compressed = framed(&[0x0a, 1, b'a']);
        compressed[0] = 1;
        assert_eq!(string_field(&compressed, 1), Err(Unreadable::Compressed));
        // A field's length past the message's end, a message cut short, a
        // second message, a group.
        let mut long = framed(&[0x0a, 9, b'a']);
        assert_eq!(string_field(&long, 1), Err(Unreadable::Malformed));
        long.truncate(6);
        assert_eq!(string_field(&long, 1), Err(Unreadable::NotOneMessage));
        let two = [framed(&[0x0a, 1, b'a']), framed(&[])].concat();
        assert_eq!(string_field(&two, 1), Err(Unreadable::NotOneMessage));
        assert_eq!(
            string_field(&framed(&[0x0b]), 1),
            Err(Unreadable::Malformed)
        );
    }
}
