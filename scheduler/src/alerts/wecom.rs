//! WeCom (WeChat Work) group robot: a markdown message. The key is in the url, nothing is
//! signed. WeCom answers HTTP 200 with `{"errcode": 0}`, or a non-zero errcode when it refuses.

use serde_json::json;

use super::Outbound;
use super::delivery::{Prepared, ServiceAnswer};

/// WeCom's "api freq out of limit": the robot's own rate limit, worth a retry.
const FREQUENCY_LIMIT: i64 = 45009;

pub(super) fn prepare(url: &reqwest::Url, message: &Outbound) -> Prepared {
    let body = json!({
        "msgtype": "markdown",
        "markdown": { "content": message.text() },
    });
    Prepared::json(url.clone(), &body)
}

pub(super) fn check(body: &[u8]) -> ServiceAnswer {
    ServiceAnswer::from_code(body, &["errcode"], "errmsg", &[FREQUENCY_LIMIT])
}
