//! The JSON-RPC 2.0 envelope of every message, typed: what a side writes is a [`Request`], a
//! [`Notification`], a [`Response`] or an [`ErrorResponse`], and what it reads is one
//! [`Message`], whose parts it parses into its method's types where it uses them. The runner's
//! host and the executor SDK both go through these, so the two ends cannot write the envelope
//! two ways.

use std::borrow::Cow;

use serde::{Deserialize, Serialize, Serializer};
use serde_json::value::RawValue;

use crate::messages::Notify;

/// `"jsonrpc": "2.0"`, the only version there is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Version;

impl Serialize for Version {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str("2.0")
    }
}

/// A request: `{"jsonrpc": "2.0", "id": ID, "method": NAME, "params": PARAMS}`, its id a
/// number as the runner writes them, or any id a test writes (`I`).
#[derive(Debug, Serialize)]
pub struct Request<'a, P, I = u64> {
    jsonrpc: Version,
    id: I,
    method: &'a str,
    params: &'a P,
}

impl<'a, P: Serialize, I: Serialize> Request<'a, P, I> {
    /// A request of the method `method` (the host's `call::<M>` gives `M::NAME` with `M`'s
    /// parameters), or a test's request that breaks the protocol on purpose.
    pub fn named(id: I, method: &'a str, params: &'a P) -> Request<'a, P, I> {
        Request { jsonrpc: Version, id, method, params }
    }
}

/// A notification: `{"jsonrpc": "2.0", "method": NAME, "params": PARAMS}`, no id.
#[derive(Debug, Serialize)]
pub struct Notification<'a, P> {
    jsonrpc: Version,
    method: &'a str,
    params: &'a P,
}

impl<'a, P: Serialize> Notification<'a, P> {
    /// A notification of kind `N`, its parameters typed as `N` takes them.
    pub fn of<N: Notify<Params = P>>(params: &'a P) -> Notification<'a, P> {
        Notification { jsonrpc: Version, method: N::NAME, params }
    }
}

/// A result: `{"jsonrpc": "2.0", "id": ID, "result": RESULT}`.
#[derive(Debug, Serialize)]
pub struct Response<'a, R> {
    jsonrpc: Version,
    id: &'a serde_json::Value,
    result: &'a R,
}

impl<'a, R: Serialize> Response<'a, R> {
    /// The answer `result` to the request `id`.
    pub fn new(id: &'a serde_json::Value, result: &'a R) -> Response<'a, R> {
        Response { jsonrpc: Version, id, result }
    }
}

/// An error: `{"jsonrpc": "2.0", "id": ID, "error": {"code": CODE, "message": MESSAGE}}`, the
/// id `null` when the request's could not be read.
#[derive(Debug, Serialize)]
pub struct ErrorResponse<'a> {
    jsonrpc: Version,
    id: &'a serde_json::Value,
    error: ErrorBody<'a>,
}

/// An error response's `error`.
#[derive(Debug, Serialize)]
struct ErrorBody<'a> {
    code: i32,
    message: &'a str,
}

impl<'a> ErrorResponse<'a> {
    /// The error `code` with `message`, in answer to the request `id`.
    pub fn new(id: &'a serde_json::Value, code: i32, message: &'a str) -> ErrorResponse<'a> {
        ErrorResponse { jsonrpc: Version, id, error: ErrorBody { code, message } }
    }
}

/// Any message, read once: what it is follows from which fields it has (an `id` and a
/// `method`: a request; a `method` alone: a notification; an `id` alone: a response), and
/// each part stays as written until the reader parses it into the type its method gives.
/// Every field is optional and of any JSON type, so that a message that breaks the protocol
/// is read and answered with what is wrong with it, rather than refused as unreadable.
#[derive(Debug, Deserialize)]
pub struct Message<'a> {
    /// `"2.0"`, or whatever was written.
    #[serde(borrow, default)]
    pub jsonrpc: Option<&'a RawValue>,
    /// Present, even as `null`: a request or a response.
    #[serde(default, deserialize_with = "present")]
    pub id: Option<serde_json::Value>,
    /// The method's name, as written (a string, unless the message breaks the protocol).
    #[serde(borrow, default)]
    pub method: Option<&'a RawValue>,
    /// The parameters, as written.
    #[serde(borrow, default)]
    pub params: Option<&'a RawValue>,
    /// A result, as written.
    #[serde(borrow, default)]
    pub result: Option<&'a RawValue>,
    /// An error, read as leniently as JSON-RPC peers write one.
    #[serde(default)]
    pub error: Option<ErrorObject>,
}

/// An error response's `error`, every field optional.
#[derive(Debug, Deserialize)]
pub struct ErrorObject {
    /// The code (0 when missing).
    #[serde(default)]
    pub code: i64,
    /// The message (empty when missing).
    #[serde(default)]
    pub message: String,
    /// Any data.
    #[serde(default)]
    pub data: Option<serde_json::Value>,
}

/// A field that is there, whatever its value (`"id": null` is an id, if a bad one).
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<serde_json::Value>, D::Error> {
    serde::Deserialize::deserialize(deserializer).map(Some)
}

/// Why a frame is no message.
#[derive(Debug)]
pub enum Unreadable {
    /// The frame is not JSON.
    NotJson(serde_json::Error),
    /// JSON, but not an object, or an object [`Message`] does not take (a field given twice);
    /// with serde's reason in the latter case.
    NotAMessage(Option<serde_json::Error>),
}

impl<'a> Message<'a> {
    /// Reads the message in `frame`. Only an object is one: serde would read a [`Message`] from
    /// an array (a batch, which the protocol has not) too.
    pub fn read(frame: &'a [u8]) -> Result<Message<'a>, Unreadable> {
        let object = frame.iter().find(|byte| !byte.is_ascii_whitespace()) == Some(&b'{');
        match serde_json::from_slice(frame) {
            Ok(message) if object => Ok(message),
            parsed => match serde_json::from_slice::<serde::de::IgnoredAny>(frame) {
                Err(error) => Err(Unreadable::NotJson(error)),
                Ok(_) => Err(Unreadable::NotAMessage(parsed.err())),
            },
        }
    }

    /// Whether it says `"jsonrpc": "2.0"`.
    pub fn is_v2(&self) -> bool {
        self.jsonrpc.and_then(|version| serde_json::from_str::<Cow<'_, str>>(version.get()).ok()).as_deref()
            == Some("2.0")
    }

    /// The method's name when it is a string (decoded if written with escapes).
    pub fn method_name(&self) -> Option<Cow<'a, str>> {
        self.method.and_then(|name| serde_json::from_str(name.get()).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{CancelParams, Empty, Method as _, rpc};

    #[test]
    fn each_envelope_is_written_as_json_rpc_writes_it() {
        let request = serde_json::to_value(Request::named(7, rpc::Ping::NAME, &Empty {})).expect("request");
        assert_eq!(request, serde_json::json!({"jsonrpc": "2.0", "id": 7, "method": "ping", "params": {}}));
        let cancel = CancelParams { id: 7.into() };
        let notification = serde_json::to_value(Notification::of::<rpc::Cancel>(&cancel)).expect("notification");
        assert_eq!(notification, serde_json::json!({"jsonrpc": "2.0", "method": "cancel", "params": {"id": 7}}));
        let id = serde_json::json!("a");
        let response = serde_json::to_value(Response::new(&id, &Empty {})).expect("response");
        assert_eq!(response, serde_json::json!({"jsonrpc": "2.0", "id": "a", "result": {}}));
        let null = serde_json::Value::Null;
        let error = serde_json::to_value(ErrorResponse::new(&null, -32700, "not JSON")).expect("error");
        assert_eq!(
            error,
            serde_json::json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": "not JSON"}})
        );
    }

    #[test]
    fn a_message_says_what_it_is_by_its_fields() {
        let text = r#"{"jsonrpc": "2.0", "id": null, "method": "p\u0069ng", "params": [1]}"#;
        let message: Message = serde_json::from_str(text).expect("message");
        assert!(message.is_v2());
        assert_eq!(message.id, Some(serde_json::Value::Null));
        assert_eq!(message.method_name().as_deref(), Some("ping"));
        assert_eq!(message.params.map(RawValue::get), Some("[1]"));

        assert!(matches!(Message::read(b"[1, 2]"), Err(Unreadable::NotAMessage(None))));
        assert!(matches!(Message::read(b" {\"id\": 1, \"id\": 2}"), Err(Unreadable::NotAMessage(Some(_)))));
        assert!(matches!(Message::read(b"{\"id\""), Err(Unreadable::NotJson(_))));
        let odd = Message::read(br#"{"jsonrpc": 2, "method": 5}"#).expect("read, if wrong");
        assert!(!odd.is_v2());
        assert_eq!(odd.id, None);
        assert_eq!(odd.method_name(), None);
        assert!(odd.method.is_some());

        let answer: Message =
            serde_json::from_str(r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32003}}"#).expect("error");
        let error = answer.error.expect("an error");
        assert_eq!((error.code, error.message.as_str()), (-32003, ""));
    }
}
