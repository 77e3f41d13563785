//! How axctl shows the links of sub-workflows: a run's parent task, its child runs, and the
//! child run an attempt of a `run_workflow` task started.

use ax_proto::v1 as pb;

/// `run 12, task load (instance 34)` for a run a `run_workflow` task started; `-` otherwise.
pub fn parent(r: &pb::Run) -> String {
    if r.parent_run_id == 0 {
        return "-".into();
    }
    let task = if r.parent_task.is_empty() {
        String::new()
    } else {
        format!(", task {}", r.parent_task)
    };
    format!(
        "run {}{task} (instance {})",
        r.parent_run_id, r.parent_instance_id
    )
}

/// `run 15, run 14`: the runs this run's `run_workflow` tasks started, newest first; `-` for none.
pub fn children(r: &pb::Run) -> String {
    if r.child_run_ids.is_empty() {
        return "-".into();
    }
    r.child_run_ids
        .iter()
        .map(|id| format!("run {id}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where an attempt runs: its worker, or for a `run_workflow` task the child run it waits on.
pub fn worker_or_child(a: &pb::Attempt) -> String {
    match (a.worker_id.as_str(), a.child_run_id) {
        ("", 0) => "-".into(),
        ("", child) => format!("child run {child}"),
        (worker, _) => worker.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_run_names_its_parent_and_a_parent_its_children() {
        let mut run = pb::Run::default();
        assert_eq!((parent(&run), children(&run)), ("-".into(), "-".into()));
        run.parent_run_id = 12;
        run.parent_instance_id = 34;
        run.parent_task = "load".into();
        assert_eq!(parent(&run), "run 12, task load (instance 34)");
        run.child_run_ids = vec![15, 14];
        assert_eq!(children(&run), "run 15, run 14");

        let mut attempt = pb::Attempt::default();
        assert_eq!(worker_or_child(&attempt), "-");
        attempt.child_run_id = 15;
        assert_eq!(worker_or_child(&attempt), "child run 15");
        attempt.worker_id = "w1".into();
        assert_eq!(worker_or_child(&attempt), "w1");
    }
}
