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
    /// `paid` (an order is stored only after its charge succeeded), or
    /// `cancelled` after a `DELETE`.
    pub status: String,
    /// The lines.
    pub items: Vec<Item>,
    /// The client-chosen id, for an order made by `PUT /api/v1/orders/{order_id}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_order_id: Option<String>,
    /// The customer's note; mutable by `PATCH`.
    pub note: Option<String>,
    /// Where to ship it: an object of strings (`line1`, `city`, …); mutable by
    /// `PATCH`, merged member by member as JSON merge patch says.
    pub shipping_address: Option<serde_json::Value>,
    /// Incremented by every change: what a conditional write compares, so the
    /// check and the write are one `UPDATE … WHERE version = ?`.
    pub version: i64,
    /// When the payment gateway confirmed the charge (Unix milliseconds), by
    /// its webhook (`POST /webhooks/payments`, [`webhook`](super::webhook));
    /// absent until then, and always without a payment webhook.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payment_confirmed_at: Option<i64>,
    /// The id of the gateway's event that confirmed it (its `webhook-id`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payment_event_id: Option<String>,
}

/// An order's status once cancelled.
pub const CANCELLED: &str = "cancelled";

/// An order's status when created (stored only after its charge succeeded).
pub const PAID: &str = "paid";

impl Order {
    /// The JSON representation every answer about this order sends.
    pub fn representation(&self) -> serde_json::Value {
        // Serializing these fields cannot fail: strings, numbers, JSON values.
        serde_json::to_value(self).unwrap_or_default()
    }

    /// Its strong `ETag`: the digest of the representation's canonical JSON.
    pub fn etag(&self) -> idemgate::conditional::EntityTag {
        idemgate::conditional::EntityTag::of_json(&self.representation())
    }

    /// The order as its create answered it: its fixed fields, and the state
    /// every order is created in (the orders insert writes `paid`, version 1,
    /// no note, no address, no payment confirmation yet). A run of the creating operation after a crash
    /// answers this, whatever edits came since (PROTOCOL §17: the journal
    /// comes first).
    pub fn as_created(self) -> Self {
        Self {
            status: PAID.to_owned(),
            note: None,
            shipping_address: None,
            version: 1,
            payment_confirmed_at: None,
            payment_event_id: None,
            ..self
        }
    }

    /// The mutable part, as it stands.
    pub fn change(&self) -> OrderChange {
        OrderChange {
            note: self.note.clone(),
            shipping_address: self.shipping_address.clone(),
            status: self.status.clone(),
        }
    }
}

/// What a write sets: the mutable fields and the status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderChange {
    /// The new note.
    pub note: Option<String>,
    /// The new shipping address.
    pub shipping_address: Option<serde_json::Value>,
    /// The new status.
    pub status: String,
}

/// The longest note, in characters.
const MAX_NOTE: usize = 1000;
/// The most members of a shipping address, and the longest of its strings.
const MAX_ADDRESS_MEMBERS: usize = 12;
const MAX_ADDRESS_VALUE: usize = 200;

/// Why a `PATCH` body was refused (422, before anything changed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidPatch {
    /// Not a JSON object.
    #[error("a merge patch is a JSON object of the fields to change: {0}")]
    Malformed(String),
    /// Names a field a patch may not change.
    #[error("{0} cannot be changed; only note and shipping_address can")]
    Immutable(String),
    /// `note` is not a string (or null) or is too long.
    #[error("note must be a string of at most {MAX_NOTE} characters, or null")]
    Note,
    /// `shipping_address` is not an object of short strings (or null).
    #[error(
        "shipping_address must be an object of at most {MAX_ADDRESS_MEMBERS} string members of at most {MAX_ADDRESS_VALUE} characters, or null"
    )]
    Address,
}

impl InvalidPatch {
    /// The field it is about, named in the problem.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::Malformed(_) => None,
            Self::Immutable(field) => Some(field),
            Self::Note => Some("note"),
            Self::Address => Some("shipping_address"),
        }
    }
}

/// A JSON merge patch (RFC 7396) of an order's mutable fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderPatch(serde_json::Map<String, serde_json::Value>);

impl OrderPatch {
    /// Parses a patch: an object naming only `note` and `shipping_address`.
    pub fn parse(body: &[u8]) -> Result<Self, InvalidPatch> {
        let value: serde_json::Value = serde_json::from_slice(body)
            .map_err(|error| InvalidPatch::Malformed(error.to_string()))?;
        let serde_json::Value::Object(members) = value else {
            return Err(InvalidPatch::Malformed("not an object".to_owned()));
        };
        if let Some(field) = members
            .keys()
            .find(|field| !matches!(field.as_str(), "note" | "shipping_address"))
        {
            return Err(InvalidPatch::Immutable(field.clone()));
        }
        Ok(Self(members))
    }

    /// The change this patch makes to `order`'s mutable fields, checked.
    pub fn apply(&self, order: &Order) -> Result<OrderChange, InvalidPatch> {
        let mut change = order.change();
        if let Some(note) = self.0.get("note") {
            change.note = match note {
                serde_json::Value::Null => None,
                serde_json::Value::String(note) if note.chars().count() <= MAX_NOTE => {
                    Some(note.clone())
                }
                _ => return Err(InvalidPatch::Note),
            };
        }
        if let Some(patch) = self.0.get("shipping_address") {
            let mut address = change
                .shipping_address
                .take()
                .unwrap_or(serde_json::Value::Null);
            merge_patch(&mut address, patch);
            change.shipping_address = match address {
                serde_json::Value::Null => None,
                serde_json::Value::Object(members)
                    if members.len() <= MAX_ADDRESS_MEMBERS
                        && members.values().all(|value| {
                            value
                                .as_str()
                                .is_some_and(|text| text.chars().count() <= MAX_ADDRESS_VALUE)
                        }) =>
                {
                    Some(serde_json::Value::Object(members))
                }
                _ => return Err(InvalidPatch::Address),
            };
        }
        Ok(change)
    }
}

/// RFC 7396 §2: an object patch merges member by member (`null` removes), any
/// other value replaces the target.
fn merge_patch(target: &mut serde_json::Value, patch: &serde_json::Value) {
    let serde_json::Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = serde_json::Value::Object(serde_json::Map::new());
    }
    if let serde_json::Value::Object(members) = target {
        for (name, value) in patch {
            if value.is_null() {
                members.remove(name);
            } else {
                merge_patch(
                    members
                        .entry(name.clone())
                        .or_insert(serde_json::Value::Null),
                    value,
                );
            }
        }
    }
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

    fn order() -> Order {
        Order {
            order_id: 1,
            amount: 1500,
            currency: "RUB".to_owned(),
            status: "paid".to_owned(),
            items: vec![],
            client_order_id: None,
            note: Some("ring twice".to_owned()),
            shipping_address: Some(serde_json::json!({"city": "Kazan", "line1": "Kremlin 1"})),
            version: 1,
            payment_confirmed_at: None,
            payment_event_id: None,
        }
    }

    #[test]
    fn merge_patch_follows_rfc_7396() {
        let patch = OrderPatch::parse(
            br#"{"note": null, "shipping_address": {"line1": "Baumana 2", "city": null, "zip": "420111"}}"#,
        )
        .unwrap();
        let change = patch.apply(&order()).unwrap();
        assert_eq!(change.note, None);
        assert_eq!(
            change.shipping_address,
            Some(serde_json::json!({"line1": "Baumana 2", "zip": "420111"}))
        );
        let untouched = OrderPatch::parse(b"{}").unwrap().apply(&order()).unwrap();
        assert_eq!(untouched, order().change());
        let cleared = OrderPatch::parse(br#"{"shipping_address": null}"#).unwrap();
        assert_eq!(cleared.apply(&order()).unwrap().shipping_address, None);
    }

    #[test]
    fn refuses_patches_of_other_fields_or_shapes() {
        assert_eq!(
            OrderPatch::parse(br#"{"amount": 1}"#),
            Err(InvalidPatch::Immutable("amount".to_owned()))
        );
        assert!(matches!(
            OrderPatch::parse(b"[]"),
            Err(InvalidPatch::Malformed(_))
        ));
        let bad_note = OrderPatch::parse(br#"{"note": 5}"#).unwrap();
        assert_eq!(bad_note.apply(&order()), Err(InvalidPatch::Note));
        let bad_address = OrderPatch::parse(br#"{"shipping_address": {"city": 5}}"#).unwrap();
        assert_eq!(bad_address.apply(&order()), Err(InvalidPatch::Address));
        let scalar = OrderPatch::parse(br#"{"shipping_address": "Kazan"}"#).unwrap();
        assert_eq!(scalar.apply(&order()), Err(InvalidPatch::Address));
    }

    fn json() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            (0_i64..5).prop_map(serde_json::Value::from),
            "[ab]{0,2}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(3, 16, 3, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..3).prop_map(serde_json::Value::from),
                proptest::collection::btree_map("[abc]", inner, 0..3)
                    .prop_map(|members| serde_json::Value::Object(members.into_iter().collect())),
            ]
        })
    }

    /// A patch with no nulls inside, as RFC 7396 §2 leaves it in the target.
    fn without_nulls(value: &serde_json::Value) -> bool {
        match value {
            serde_json::Value::Null => false,
            serde_json::Value::Object(members) => members.values().all(without_nulls),
            _ => true,
        }
    }

    proptest::proptest! {
        /// RFC 7396: a patch applied twice is applied once, and a patch with no
        /// nulls leaves the target holding every value it names.
        #[test]
        fn merge_patch_is_idempotent(target in json(), patch in json()) {
            let mut once = target.clone();
            merge_patch(&mut once, &patch);
            let mut twice = once.clone();
            merge_patch(&mut twice, &patch);
            proptest::prop_assert_eq!(&once, &twice);
            if without_nulls(&patch) && !patch.is_object() {
                proptest::prop_assert_eq!(&once, &patch);
            }
        }

        #[test]
        fn any_bytes_parse_or_refuse_without_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            if let Ok(patch) = OrderPatch::parse(&bytes) {
                let _ = patch.apply(&order());
            }
        }
    }

    #[test]
    fn the_etag_changes_with_the_representation_only() {
        let mut other = order();
        assert_eq!(order().etag(), other.etag());
        other.note = Some("leave at the door".to_owned());
        assert_ne!(order().etag(), other.etag());
    }

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
