//! DingTalk group robot: a markdown message. With a secret ("加签"), the url gets `timestamp`
//! (Unix milliseconds) and `sign` = base64(HMAC-SHA256(key = secret, "{timestamp}\n{secret}")),
//! url-encoded. DingTalk answers HTTP 200 with `{"errcode": 0}`, or a non-zero errcode when it
//! refuses the message.

use base64::Engine;
use serde_json::json;

use super::Outbound;
use super::delivery::{Prepared, ServiceAnswer, hmac_sha256};

/// DingTalk's code for "sent too fast": the robot's own rate limit, worth a retry.
const SENT_TOO_FAST: i64 = 130101;

pub(super) fn prepare(
    url: &reqwest::Url,
    secret: Option<&str>,
    message: &Outbound,
    now_ms: i64,
) -> Prepared {
    let mut url = url.clone();
    if let Some(secret) = secret {
        // The serializer percent-encodes the base64 `+`, `/` and `=`, as DingTalk requires.
        url.query_pairs_mut()
            .append_pair("timestamp", &now_ms.to_string())
            .append_pair("sign", &sign(now_ms, secret));
    }
    let body = json!({
        "msgtype": "markdown",
        "markdown": { "title": message.title(), "text": message.text() },
    });
    Prepared::json(url, &body)
}

/// The signature before url encoding.
pub(super) fn sign(timestamp_ms: i64, secret: &str) -> String {
    let string_to_sign = format!("{timestamp_ms}\n{secret}");
    let mac = hmac_sha256(secret.as_bytes(), string_to_sign.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(mac)
}

pub(super) fn check(body: &[u8]) -> ServiceAnswer {
    ServiceAnswer::from_code(body, &["errcode"], "errmsg", &[SENT_TOO_FAST])
}
