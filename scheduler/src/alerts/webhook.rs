//! ax's generic JSON webhook: the schema in the module doc of `alerts`, version 1. With a secret,
//! `X-Ax-Signature: sha256=<hex HMAC-SHA256(key = secret, body)>`.

use serde::Serialize;

use super::delivery::{Prepared, hmac_sha256};
use super::{Alert, Outbound};

pub(super) const SCHEMA_VERSION: u32 = 1;
pub(super) const SIGNATURE_HEADER: &str = "x-ax-signature";

#[derive(Serialize)]
struct Body<'a> {
    version: u32,
    kind: &'a str,
    workflow: &'a str,
    run_id: Option<i64>,
    instance_id: Option<i64>,
    task: Option<&'a str>,
    attempt: Option<u32>,
    worker: Option<&'a str>,
    message: &'a str,
    at_ms: i64,
    suppressed: Option<u64>,
    text: String,
}

fn body(message: &Outbound) -> Body<'_> {
    match message {
        Outbound::Alert(alert) => {
            let Alert {
                kind,
                workflow,
                run_id,
                instance_id,
                task,
                attempt,
                worker,
                message: what,
                at_ms,
            } = alert;
            Body {
                version: SCHEMA_VERSION,
                kind: kind.as_str(),
                workflow,
                run_id: *run_id,
                instance_id: *instance_id,
                task: task.as_deref(),
                attempt: *attempt,
                worker: worker.as_deref(),
                message: what,
                at_ms: *at_ms,
                suppressed: None,
                text: message.text(),
            }
        }
        Outbound::Suppressed { count, at_ms } => Body {
            version: SCHEMA_VERSION,
            kind: "alerts_suppressed",
            workflow: "",
            run_id: None,
            instance_id: None,
            task: None,
            attempt: None,
            worker: None,
            message: "alerts dropped by this channel's rate limit",
            at_ms: *at_ms,
            suppressed: Some(*count),
            text: message.text(),
        },
    }
}

pub(super) fn prepare(url: &reqwest::Url, secret: Option<&str>, message: &Outbound) -> Prepared {
    let mut prepared = Prepared::json(url.clone(), &body(message));
    if let Some(secret) = secret {
        let mac = hmac_sha256(secret.as_bytes(), &prepared.body);
        let hex: String = mac.iter().map(|byte| format!("{byte:02x}")).collect();
        prepared
            .headers
            .push((SIGNATURE_HEADER, format!("sha256={hex}")));
    }
    prepared
}
