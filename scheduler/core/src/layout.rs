//! Where each task of a graph is drawn: a layered (Sugiyama) layout read left to right, roots in
//! the first column and every edge pointing right. `rust-sugiyama` does the work (layering,
//! crossing reduction, Brandes–Köpf placement); this module turns its answer into columns and
//! rows of fixed-size boxes, and packs each column (same order, centred) where the aligned
//! placement would be far taller than the widest column needs.
//!
//! Parts of the graph that share no edge are laid out apart and stacked top to bottom, largest
//! first; tasks with no edge at all are packed into a grid below them. Pure: a server computes
//! it once per workflow version (versions never change) and keeps it.

use std::collections::BTreeMap;

use rust_sugiyama::configure::{Config, RankingType};

/// A task's box, in layout units (pixels at 100%).
pub const NODE_WIDTH: f64 = 200.0;
pub const NODE_HEIGHT: f64 = 44.0;
/// Between columns (layers), where the edges run.
const LAYER_GAP: f64 = 72.0;
/// Between boxes of one column.
const ROW_GAP: f64 = 14.0;
/// A part whose aligned placement is more than this many times the height of its widest
/// column, packed, is drawn packed.
const LOOSE_FACTOR: f64 = 1.5;
/// Between stacked parts of the graph.
const PART_GAP: f64 = 40.0;
/// Graphs with more tasks than this are not laid out: a page lists and filters them instead.
pub const MAX_TASKS: usize = 5_000;

/// One task's place: the centre of its box and its column.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Placed {
    pub x: f64,
    pub y: f64,
    pub layer: u32,
}

/// A laid-out graph: one place per node of the graph, in the graph's node order.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    pub nodes: Vec<Placed>,
    pub width: f64,
    pub height: f64,
}

/// Why a graph was not laid out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Omitted {
    #[error("{tasks} tasks is more than the {max} a drawing shows; filter the task list instead")]
    TooLarge { tasks: usize, max: usize },
    #[error("the layout of this graph failed; the task list still shows every task")]
    Failed,
}

/// The column a box of `layer` is centred on.
fn column_x(layer: u32) -> f64 {
    f64::from(layer) * (NODE_WIDTH + LAYER_GAP) + NODE_WIDTH / 2.0
}

/// The layout of a graph of `count` tasks (numbered in file order) and its (upstream,
/// downstream) `edges`; task states do not move boxes.
pub fn layout(count: usize, edges: &[(usize, usize)]) -> Result<Layout, Omitted> {
    if count > MAX_TASKS {
        return Err(Omitted::TooLarge {
            tasks: count,
            max: MAX_TASKS,
        });
    }
    let mut has_edge = vec![false; count];
    let mut kept: Vec<(u32, u32)> = Vec::new();
    for &(u, d) in edges {
        if u == d || u >= count || d >= count {
            continue;
        }
        has_edge[u] = true;
        has_edge[d] = true;
        kept.push((u as u32, d as u32));
    }
    kept.sort_unstable();
    kept.dedup();

    // The library lays layers out top to bottom; ours run left to right, so a box's height is
    // its width across a layer.
    let vertices: Vec<(u32, (f64, f64))> = (0..count)
        .filter(|&i| has_edge[i])
        .map(|i| (i as u32, (NODE_HEIGHT, NODE_WIDTH)))
        .collect();
    // Longest-path layering (`Up`: each task in the first column after all its upstreams).
    // The library's default, network simplex, took minutes on a 2,000-task graph whose edges
    // came in sorted order; this takes tens of milliseconds on any order.
    let config = Config {
        vertex_spacing: ROW_GAP,
        ranking_type: RankingType::Up,
        ..Config::default()
    };
    let mut parts: Vec<Vec<(usize, (f64, f64))>> = if vertices.is_empty() {
        Vec::new()
    } else {
        rust_sugiyama::from_vertices_and_edges(&vertices, &kept, &config)
            .into_iter()
            .map(|(part, _, _)| part)
            .collect()
    };
    // Largest part first, ties by the first task's file position: the same graph always
    // stacks the same way.
    parts.sort_by_key(|part| {
        let first = part.iter().map(|&(i, _)| i).min().unwrap_or(0);
        (std::cmp::Reverse(part.len()), first)
    });

    let mut nodes = vec![
        Placed {
            x: 0.0,
            y: 0.0,
            layer: 0,
        };
        count
    ];
    let mut top = 0.0;
    let mut layers_used = 0;
    for part in &parts {
        let placed = place_part(part);
        let mut bottom: f64 = top;
        for &(i, (layer, across)) in &placed {
            let y = top + across + NODE_HEIGHT / 2.0;
            nodes[i] = Placed {
                x: column_x(layer),
                y,
                layer,
            };
            bottom = bottom.max(y + NODE_HEIGHT / 2.0);
            layers_used = layers_used.max(layer + 1);
        }
        top = bottom + PART_GAP;
    }

    let loose: Vec<usize> = (0..count).filter(|&i| !has_edge[i]).collect();
    let columns = layers_used.max(4) as usize;
    for (k, &i) in loose.iter().enumerate() {
        let layer = (k % columns) as u32;
        let row = (k / columns) as f64;
        nodes[i] = Placed {
            x: column_x(layer),
            y: top + row * (NODE_HEIGHT + ROW_GAP) + NODE_HEIGHT / 2.0,
            layer,
        };
    }
    let width = nodes
        .iter()
        .map(|p| p.x + NODE_WIDTH / 2.0)
        .fold(0.0, f64::max);
    let height = nodes
        .iter()
        .map(|p| p.y + NODE_HEIGHT / 2.0)
        .fold(0.0, f64::max);
    Ok(Layout {
        nodes,
        width,
        height,
    })
}

/// One part's nodes as (layer, offset across the layers from the part's top edge).
fn place_part(part: &[(usize, (f64, f64))]) -> Vec<(usize, (u32, f64))> {
    // The library's y is a node's layer; its distinct values in order are the columns.
    let mut depths: Vec<f64> = part.iter().map(|&(_, (_, y))| y).collect();
    depths.sort_by(f64::total_cmp);
    depths.dedup_by(|a, b| (*a - *b).abs() < 1e-6);
    let layer_of = |y: f64| depths.partition_point(|&d| d < y - 1e-6) as u32;

    // Its x orders and spreads the boxes of a layer. Each box keeps its place unless that
    // would overlap the box before it in its layer, which pushes it down to one pitch below
    // (the library's spacing is not always a whole box apart).
    let left = part
        .iter()
        .map(|&(_, (x, _))| x)
        .fold(f64::INFINITY, f64::min);
    let mut by_layer: BTreeMap<u32, Vec<(f64, usize)>> = BTreeMap::new();
    for &(i, (x, y)) in part {
        by_layer.entry(layer_of(y)).or_default().push((x - left, i));
    }
    let pitch = NODE_HEIGHT + ROW_GAP;
    let mut aligned = Vec::with_capacity(part.len());
    for (layer, boxes) in by_layer.iter_mut() {
        boxes.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut next = 0.0_f64;
        for &(x, i) in boxes.iter() {
            let at = x.max(next);
            aligned.push((i, (*layer, at)));
            next = at + pitch;
        }
    }
    // Brandes–Köpf aligns boxes along edges, which on a big, densely crossed graph spreads
    // the columns over several times the height its widest column needs. Then each column is
    // packed instead, in the same order (so no crossing is added), centred on one line.
    let extent = |placed: &[(usize, (u32, f64))]| {
        placed.iter().map(|&(_, (_, at))| at).fold(0.0, f64::max) + NODE_HEIGHT
    };
    let widest = by_layer.values().map(Vec::len).max().unwrap_or(1);
    let packed_extent = (widest - 1) as f64 * pitch + NODE_HEIGHT;
    if extent(&aligned) <= LOOSE_FACTOR * packed_extent {
        return aligned;
    }
    let mut packed = Vec::with_capacity(part.len());
    for (layer, boxes) in &by_layer {
        let top = (widest - boxes.len()) as f64 * pitch / 2.0;
        for (k, &(_, i)) in boxes.iter().enumerate() {
            packed.push((i, (*layer, top + k as f64 * pitch)));
        }
    }
    packed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::Graph;

    fn layout(graph: &Graph) -> Result<Layout, Omitted> {
        super::layout(graph.nodes.len(), &graph.edges)
    }

    fn graph(tasks: &[(&str, &[&str])]) -> Graph {
        let tasks: Vec<(String, Vec<String>)> = tasks
            .iter()
            .map(|(name, up)| (name.to_string(), up.iter().map(|u| u.to_string()).collect()))
            .collect();
        Graph::from_upstreams("w", 1, &tasks)
    }

    fn overlaps(a: &Placed, b: &Placed) -> bool {
        (a.x - b.x).abs() < NODE_WIDTH && (a.y - b.y).abs() < NODE_HEIGHT
    }

    fn assert_sound(graph: &Graph, layout: &Layout) {
        assert_eq!(layout.nodes.len(), graph.nodes.len());
        for (i, a) in layout.nodes.iter().enumerate() {
            for b in &layout.nodes[i + 1..] {
                assert!(!overlaps(a, b), "boxes overlap: {a:?} and {b:?}");
            }
            assert!(a.x + NODE_WIDTH / 2.0 <= layout.width + 1e-6);
            assert!(a.y + NODE_HEIGHT / 2.0 <= layout.height + 1e-6);
            assert!(a.x >= NODE_WIDTH / 2.0 - 1e-6 && a.y >= NODE_HEIGHT / 2.0 - 1e-6);
        }
        for &(u, d) in &graph.edges {
            let (from, to) = (layout.nodes[u], layout.nodes[d]);
            assert!(from.layer < to.layer, "edge {u}->{d} does not point right");
            assert!(from.x < to.x);
        }
    }

    #[test]
    fn a_fan_in_puts_roots_first_and_the_join_after_both_branches() {
        let g = graph(&[
            ("extract_a", &[]),
            ("extract_b", &[]),
            ("clean", &["extract_a"]),
            ("join", &["clean", "extract_b"]),
            ("lonely", &[]),
        ]);
        let layout = layout(&g).unwrap();
        assert_sound(&g, &layout);
        assert_eq!(layout.nodes[0].layer, 0);
        assert_eq!(layout.nodes[2].layer, 1);
        assert_eq!(layout.nodes[3].layer, 2);
        // The task with no edge sits below the connected part.
        let connected_bottom = layout.nodes[..4].iter().map(|p| p.y).fold(0.0, f64::max);
        assert!(layout.nodes[4].y > connected_bottom);
    }

    #[test]
    fn a_wide_layered_graph_of_two_thousand_tasks_is_laid_out_without_overlaps() {
        let names: Vec<String> = (0..2_000).map(|i| format!("t{i}")).collect();
        let tasks: Vec<(String, Vec<String>)> = (0..2_000)
            .map(|i| {
                let up = if i < 40 {
                    vec![]
                } else {
                    vec![names[i - 40].clone(), names[i - 40 + (i % 7)].clone()]
                };
                (names[i].clone(), up)
            })
            .collect();
        let g = Graph::from_upstreams("big", 1, &tasks);
        let layout = layout(&g).unwrap();
        assert_sound(&g, &layout);
        // t39 -> t79 -> ... -> t1999 alone has 49 edges; shorter steps make longer chains.
        assert!(layout.nodes[1_999].layer >= 49);
    }

    #[test]
    fn parts_without_a_shared_edge_are_stacked_largest_first() {
        let g = graph(&[
            ("a", &[]),
            ("b", &["a"]),
            ("c", &[]),
            ("d", &["c"]),
            ("e", &["d"]),
        ]);
        let first = layout(&g).unwrap();
        assert_sound(&g, &first);
        // The larger part (c, d, e) is on top.
        assert!(first.nodes[2].y < first.nodes[0].y);
    }

    #[test]
    fn a_graph_past_the_limit_is_not_laid_out_and_says_why() {
        let tasks: Vec<(String, Vec<String>)> =
            (0..=MAX_TASKS).map(|i| (format!("t{i}"), vec![])).collect();
        let g = Graph::from_upstreams("huge", 1, &tasks);
        let omitted = layout(&g).unwrap_err();
        assert!(omitted.to_string().contains("5001 tasks"), "{omitted}");
    }

    #[test]
    fn an_empty_graph_has_no_extent() {
        let layout = layout(&graph(&[])).unwrap();
        assert!(layout.nodes.is_empty());
        assert_eq!((layout.width, layout.height), (0.0, 0.0));
    }

    #[test]
    fn a_big_densely_crossed_graph_is_packed_to_its_widest_column() {
        // 50 layers of 40, each task fed by two or three of the layer before, some across.
        let (layers, width) = (50, 40);
        let mut tasks: Vec<(String, Vec<String>)> = Vec::new();
        for l in 0..layers {
            for i in 0..width {
                let mut ups = vec![i, (i + 1) % width, (i + width / 2 + 1) % width];
                ups.sort_unstable();
                ups.dedup();
                let ups = if l == 0 {
                    Vec::new()
                } else {
                    ups.iter().map(|u| format!("l{}_{u}", l - 1)).collect()
                };
                tasks.push((format!("l{l}_{i}"), ups));
            }
        }
        let g = Graph::from_upstreams("big", 1, &tasks);
        let laid = layout(&g).unwrap();
        assert_sound(&g, &laid);
        let widest = (width - 1) as f64 * (NODE_HEIGHT + ROW_GAP) + NODE_HEIGHT;
        assert!(
            laid.height <= widest * LOOSE_FACTOR,
            "{} tall for a widest column of {widest}",
            laid.height
        );
    }
}
