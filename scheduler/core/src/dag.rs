//! TODO(helper): dag
