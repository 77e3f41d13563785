//! Feishu/Lark custom bot: a text message. With a secret ("签名校验"), the body gets
//! `timestamp` (Unix seconds, as a string) and `sign` = base64(HMAC-SHA256(key =
//! "{timestamp}\n{secret}", empty message)). Feishu answers HTTP 200 with `{"code": 0}` (some
//! deployments: `{"StatusCode": 0}`), or a non-zero code when it refuses the message.

use base64::Engine;
use serde_json::json;

use super::Outbound;
use super::delivery::{Prepared, ServiceAnswer, hmac_sha256};

pub(super) fn prepare(
    url: &reqwest::Url,
    secret: Option<&str>,
    message: &Outbound,
    now_ms: i64,
) -> Prepared {
    let mut body = json!({
        "msg_type": "text",
        "content": { "text": message.text() },
    });
    if let (Some(secret), Some(fields)) = (secret, body.as_object_mut()) {
        let timestamp = now_ms.div_euclid(1000);
        fields.insert("timestamp".into(), json!(timestamp.to_string()));
        fields.insert("sign".into(), json!(sign(timestamp, secret)));
    }
    Prepared::json(url.clone(), &body)
}

pub(super) fn sign(timestamp_s: i64, secret: &str) -> String {
    let string_to_sign = format!("{timestamp_s}\n{secret}");
    let mac = hmac_sha256(string_to_sign.as_bytes(), b"");
    base64::engine::general_purpose::STANDARD.encode(mac)
}

pub(super) fn check(body: &[u8]) -> ServiceAnswer {
    ServiceAnswer::from_code(body, &["code", "StatusCode"], "msg", &[])
}
