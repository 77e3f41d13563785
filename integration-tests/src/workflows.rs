//! Workflow files that tests generate rather than keep as fixtures.

/// The name of task `index` of `layer`.
fn task_name(layer: usize, index: usize) -> String {
    format!("l{layer}_{index}")
}

/// The upstreams of task `index` of layer `layer` (> 0): two or three tasks of the layer before.
fn upstreams(layer: usize, index: usize, width: usize) -> Vec<String> {
    let mut ups = vec![index, (index + 1) % width];
    if index.is_multiple_of(2) {
        ups.push((index + width / 2 + 1) % width);
    }
    ups.sort_unstable();
    ups.dedup();
    ups.into_iter().map(|i| task_name(layer - 1, i)).collect()
}

/// A workflow file of `layers` × `width` tasks running `true`.
pub fn layered(name: &str, layers: usize, width: usize) -> String {
    let mut source = format!("name: {name}\ntasks:\n");
    for layer in 0..layers {
        for index in 0..width {
            source.push_str(&format!(
                "  - name: {}\n    command: 'true'\n",
                task_name(layer, index)
            ));
            if layer > 0 {
                source.push_str(&format!(
                    "    upstream: [{}]\n",
                    upstreams(layer, index, width).join(", ")
                ));
            }
        }
    }
    source
}
