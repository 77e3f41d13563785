//! TODO(helper): cron
