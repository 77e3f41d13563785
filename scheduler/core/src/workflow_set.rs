//! A set of workflow files applied together (`axctl apply -f DIR`, `ApplyWorkflows`): the
//! checks that span its files. A name declared by two files is an error naming both; the
//! cross-workflow `after` checks see the workflows as they will be once the set is applied
//! (stored ones, those of the set in their place, pruned ones gone), so two new files that
//! name each other are a cycle and a file naming another file of the set names a workflow that
//! exists.

use std::collections::{BTreeMap, BTreeSet};

/// One file of a set, as the checks need it.
#[derive(Debug, Clone, Copy)]
pub struct Member<'a> {
    /// Where it came from, as errors name it.
    pub file: &'a str,
    pub source: &'a str,
    /// The workflow it declares.
    pub name: &'a str,
    /// Its `schedule.after`.
    pub after: &'a [String],
}

/// `FILE:LINE: name: workflow "x" is also declared in FIRST` for each file that declares a
/// workflow an earlier file of the set declared.
pub fn duplicate_names(members: &[Member<'_>]) -> Vec<String> {
    let mut first: BTreeMap<&str, &str> = BTreeMap::new();
    let mut errors = Vec::new();
    for member in members {
        match first.get(member.name) {
            Some(earlier) => errors.push(format!(
                "{}:{}: name: workflow {:?} is also declared in {earlier}; a name is one \
                 workflow",
                member.file,
                name_line(member.source),
                member.name
            )),
            None => {
                first.insert(member.name, member.file);
            }
        }
    }
    errors
}

/// The 1-based line of the file's top-level `name:` key (0 when there is none to point at).
pub fn name_line(source: &str) -> usize {
    source
        .lines()
        .position(|line| {
            line.strip_prefix("name")
                .is_some_and(|rest| rest.trim_start().starts_with(':'))
        })
        .map_or(0, |index| index + 1)
}

/// Every workflow's `after` list once the set is applied: the stored lists (`stored`, by
/// workflow), each member's own in place of its stored one, and none for a pruned workflow.
pub fn dependencies_after(
    stored: &BTreeMap<String, Vec<String>>,
    members: &[Member<'_>],
    pruned: &BTreeSet<String>,
) -> BTreeMap<String, Vec<String>> {
    let mut graph: BTreeMap<String, Vec<String>> = stored
        .iter()
        .filter(|(name, _)| !pruned.contains(*name))
        .map(|(name, after)| (name.clone(), after.clone()))
        .collect();
    for member in members {
        if member.after.is_empty() {
            graph.remove(member.name);
        } else {
            graph.insert(member.name.to_string(), member.after.to_vec());
        }
    }
    graph
}

/// The workflows that will exist once the set is applied: the live ones, less the pruned, and
/// the set's own.
pub fn names_after(
    live: &BTreeSet<String>,
    members: &[Member<'_>],
    pruned: &BTreeSet<String>,
) -> BTreeSet<String> {
    live.difference(pruned)
        .cloned()
        .chain(members.iter().map(|member| member.name.to_string()))
        .collect()
}

/// `schedule.after: workflow X is deleted; Y names it in schedule.after and runs only once it is
/// applied again`, for each live workflow left naming a workflow the set deletes.
pub fn orphaned_dependents(
    graph_after: &BTreeMap<String, Vec<String>>,
    deleted: &BTreeSet<String>,
) -> Vec<String> {
    let mut warnings = Vec::new();
    for (dependent, after) in graph_after {
        for upstream in after.iter().filter(|name| deleted.contains(*name)) {
            warnings.push(format!(
                "schedule.after: workflow {upstream} is deleted; {dependent} names it in \
                 schedule.after and runs only once it is applied again"
            ));
        }
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dependency::find_cycle;

    fn member<'a>(
        file: &'a str,
        source: &'a str,
        name: &'a str,
        after: &'a [String],
    ) -> Member<'a> {
        Member {
            file,
            source,
            name,
            after,
        }
    }

    fn strings(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| name.to_string()).collect()
    }

    #[test]
    fn a_name_declared_twice_names_both_files_and_the_line() {
        let none = Vec::new();
        let members = [
            member("a.yaml", "name: etl\n", "etl", &none),
            member("b.yaml", "# the same\n\nname:   etl\n", "etl", &none),
            member("c.yaml", "name: other\n", "other", &none),
            member("d/e.yaml", "app: x\nname : etl\n", "etl", &none),
        ];
        assert_eq!(
            duplicate_names(&members),
            [
                "b.yaml:3: name: workflow \"etl\" is also declared in a.yaml; a name is one \
                 workflow",
                "d/e.yaml:2: name: workflow \"etl\" is also declared in a.yaml; a name is one \
                 workflow"
            ]
        );
        assert_eq!(name_line("  name: nested\nnamespace: x\n"), 0);
    }

    #[test]
    fn the_graph_after_the_set_sees_every_file_and_forgets_the_pruned() {
        let stored = BTreeMap::from([
            ("report".to_string(), strings(&["ingest"])),
            ("old".to_string(), strings(&["report"])),
        ]);
        let (ingest_after, loader_after, report_after) =
            (strings(&["loader"]), strings(&["ingest"]), Vec::new());
        let members = [
            member("ingest.yaml", "", "ingest", &ingest_after),
            member("loader.yaml", "", "loader", &loader_after),
            member("report.yaml", "", "report", &report_after),
        ];
        let pruned = BTreeSet::from(["old".to_string()]);
        let graph = dependencies_after(&stored, &members, &pruned);
        assert_eq!(
            graph,
            BTreeMap::from([
                ("ingest".to_string(), strings(&["loader"])),
                ("loader".to_string(), strings(&["ingest"])),
            ])
        );
        // Two new files that name each other close a loop, seen from either.
        let cycle = find_cycle("ingest", &ingest_after, &graph).unwrap_err();
        assert_eq!(cycle.path, ["ingest", "loader", "ingest"]);

        let live = BTreeSet::from(["old".to_string(), "report".to_string(), "x".to_string()]);
        assert_eq!(
            names_after(&live, &members, &pruned),
            BTreeSet::from(["ingest", "loader", "report", "x"].map(str::to_string))
        );
    }

    #[test]
    fn dependents_of_a_deleted_workflow_are_warned_about() {
        let graph = BTreeMap::from([
            ("report".to_string(), strings(&["ingest", "dims"])),
            ("other".to_string(), strings(&["dims"])),
        ]);
        let deleted = BTreeSet::from(["ingest".to_string()]);
        assert_eq!(
            orphaned_dependents(&graph, &deleted),
            [
                "schedule.after: workflow ingest is deleted; report names it in schedule.after \
              and runs only once it is applied again"
            ]
        );
    }
}
