//! Slack incoming webhook: `{"text": …}`, rendered as mrkdwn. Slack answers 200 `ok`, or a 4xx
//! with a reason in the body.

use serde_json::json;

use super::Outbound;
use super::delivery::Prepared;

pub(super) fn prepare(url: &reqwest::Url, message: &Outbound) -> Prepared {
    let body = json!({ "text": escape(&message.text()) });
    Prepared::json(url.clone(), &body)
}

/// Slack reads `&`, `<` and `>` as control characters in message text; these three, and only
/// these, must be escaped.
pub(super) fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
