//! The order a client asks for, and the checks it must pass before anything is
//! charged.

use serde::{Deserialize, Serialize};

/// One line of an order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    /// Product id.
    pub id: i64,
    /// How many; at least 1.
    pub quantity: i64,
}

/// `POST /api/v1/orders` body, as sent.
#[derive(Debug, Deserialize)]
struct OrderRequest {
    items: Vec<Item>,
    currency: String,
    amount: i64,
}

/// A validated order request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewOrder {
    /// The lines.
    pub items: Vec<Item>,
    /// Upper-case ISO 4217 code.
    pub currency: String,
    /// Total in minor units; positive.
    pub amount: i64,
}

/// A stored order, as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Order {
    /// Its id.
    pub order_id: i64,
    /// Total charged.
    pub amount: i64,
    /// Currency of the charge.
    pub currency: String,
    /// Always `paid`: an order is stored only after its charge succeeded.
    pub status: String,
    /// The lines.
    pub items: Vec<Item>,
    /// The client-chosen id, for an order made by `PUT /api/v1/orders/{order_id}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_order_id: Option<String>,
}

/// Why an order request was refused (400, before any charge).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidOrder {
    /// Not UTF-8 (so not JSON, RFC 8259 §8.1), anywhere, strings included: a
    /// JSON parser skipping an unknown member would not notice.
    #[error("the body is not valid UTF-8 (invalid bytes at offset {0}); JSON must be UTF-8")]
    NotUtf8(usize),
    /// Not JSON of the expected shape.
    #[error("the body is not a valid order: {0}")]
    Malformed(String),
    /// `items` is empty.
    #[error("an order needs at least one item")]
    NoItems,
    /// An item's quantity is below 1.
    #[error("item {id} has quantity {quantity}; it must be at least 1")]
    Quantity {
        /// The item.
        id: i64,
        /// Its quantity.
        quantity: i64,
    },
    /// `amount` is zero or negative.
    #[error("amount must be positive, got {0}")]
    Amount(i64),
    /// `currency` is not three letters.
    #[error("currency must be a three-letter ISO 4217 code, got {0:?}")]
    Currency(String),
    /// A client-chosen order id that is not 1–64 letters, digits, `-` or `_`.
    #[error("an order id is 1 to 64 letters, digits, '-' or '_'")]
    OrderId,
}

/// Checks a client-chosen order id (`PUT /api/v1/orders/{order_id}`): 1–64 ASCII
/// letters, digits, `-` or `_`, so it is a valid idempotency key and a clean URL
/// segment.
pub fn check_client_order_id(id: &str) -> Result<(), InvalidOrder> {
    let valid = (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if valid {
        Ok(())
    } else {
        Err(InvalidOrder::OrderId)
    }
}

impl Order {
    /// The fields where `request` asks for something else than this order
    /// holds, by their names in the request body.
    pub fn differing_fields(&self, request: &NewOrder) -> Vec<&'static str> {
        let mut fields = Vec::new();
        if self.items != request.items {
            fields.push("items");
        }
        if self.currency != request.currency {
            fields.push("currency");
        }
        if self.amount != request.amount {
            fields.push("amount");
        }
        fields
    }
}

impl NewOrder {
    /// Parses and checks a request body.
    pub fn parse(body: &[u8]) -> Result<Self, InvalidOrder> {
        let body = std::str::from_utf8(body)
            .map_err(|error| InvalidOrder::NotUtf8(error.valid_up_to()))?;
        let request: OrderRequest = serde_json::from_str(body)
            .map_err(|error| InvalidOrder::Malformed(error.to_string()))?;
        if request.items.is_empty() {
            return Err(InvalidOrder::NoItems);
        }
        if let Some(item) = request.items.iter().find(|item| item.quantity < 1) {
            return Err(InvalidOrder::Quantity {
                id: item.id,
                quantity: item.quantity,
            });
        }
        if request.amount <= 0 {
            return Err(InvalidOrder::Amount(request.amount));
        }
        if request.currency.len() != 3 || !request.currency.bytes().all(|b| b.is_ascii_alphabetic())
        {
            return Err(InvalidOrder::Currency(request.currency));
        }
        Ok(Self {
            items: request.items,
            currency: request.currency.to_ascii_uppercase(),
            amount: request.amount,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_order_ids_are_short_plain_tokens() {
        for id in ["a", "ORD-2026_001", &"x".repeat(64)] {
            assert_eq!(check_client_order_id(id), Ok(()), "{id}");
        }
        for id in ["", " a", "a b", "a/b", "ä", "a.b", &"x".repeat(65)] {
            assert_eq!(
                check_client_order_id(id),
                Err(InvalidOrder::OrderId),
                "{id}"
            );
        }
    }

    #[test]
    fn accepts_the_seed_order() {
        let order = NewOrder::parse(
            br#"{"items":[{"id":42,"quantity":1}],"currency":"RUB","amount":1500}"#,
        )
        .unwrap();
        assert_eq!(order.amount, 1500);
        assert_eq!(order.currency, "RUB");
        assert_eq!(
            order.items,
            vec![Item {
                id: 42,
                quantity: 1
            }]
        );
    }

    #[test]
    fn refuses_bodies_that_are_not_utf8_even_in_an_unknown_member() {
        let valid = br#"{"items":[{"id":42,"quantity":1}],"currency":"RUB","amount":1500,"x":"/"}"#;
        assert!(NewOrder::parse(valid).is_ok());
        let slash = valid.len() - 3;
        for invalid in [&b"\xc3\x28"[..], &b"\xc0\xaf"[..], &b"\xff"[..]] {
            let mut body = valid[..slash].to_vec();
            body.extend_from_slice(invalid);
            body.extend_from_slice(&valid[slash + 1..]);
            assert_eq!(
                NewOrder::parse(&body),
                Err(InvalidOrder::NotUtf8(slash)),
                "{body:?}"
            );
        }
    }

    #[test]
    fn refuses_each_broken_field() {
        type Check = fn(&InvalidOrder) -> bool;
        let cases: [(&str, Check); 7] = [
            ("not json", |e| matches!(e, InvalidOrder::Malformed(_))),
            (r#"{"items":[],"currency":"RUB","amount":1}"#, |e| {
                *e == InvalidOrder::NoItems
            }),
            (
                r#"{"items":[{"id":1,"quantity":0}],"currency":"RUB","amount":1}"#,
                |e| matches!(e, InvalidOrder::Quantity { .. }),
            ),
            (
                r#"{"items":[{"id":1,"quantity":1}],"currency":"RUB","amount":0}"#,
                |e| *e == InvalidOrder::Amount(0),
            ),
            (
                r#"{"items":[{"id":1,"quantity":1}],"currency":"RUBL","amount":1}"#,
                |e| matches!(e, InvalidOrder::Currency(_)),
            ),
            (
                r#"{"items":[{"id":1,"quantity":1}],"currency":"R1B","amount":1}"#,
                |e| matches!(e, InvalidOrder::Currency(_)),
            ),
            (
                r#"{"items":[{"id":1,"quantity":1}],"currency":"RUB","amount":1.5}"#,
                |e| matches!(e, InvalidOrder::Malformed(_)),
            ),
        ];
        for (body, expected) in cases {
            let error = NewOrder::parse(body.as_bytes()).unwrap_err();
            assert!(expected(&error), "{body}: {error:?}");
        }
    }
}
