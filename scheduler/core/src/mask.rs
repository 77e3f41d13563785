//! Which bytes of an attempt's log lines show a secret's value, and the lines with them masked.
//!
//! A worker cuts an overlong line into several (ax-worker and the Python SDK at 64 KiB, a
//! worker of the proto alone wherever it likes) and says nothing about where it cut, so a
//! value printed across a cut arrives as a line ending in its first part and a line starting
//! with the rest, and the two lines may even come in different chunks. A node masks with no
//! memory between chunks (a worker may resend a chunk to another node), so it reads each chunk
//! this way:
//! - the lines of one stream are read joined, without their line breaks: a value found there is
//!   masked in every line it touches, whole or in part (a value a task prints across two lines
//!   of its own is masked too);
//! - at the chunk's edges, where the rest of a cut value lies in the chunk before or after, a
//!   stream's text that starts with the end of a value, ends with its start, or lies wholly
//!   inside one, is masked when that piece is at least `min_piece` bytes long. Shorter pieces
//!   stay: they give away a few bytes of the value, and masking every line that starts with
//!   a value's last two bytes would garble ordinary output. The start of the first chunk of an
//!   attempt has nothing before it and is read as is.

use std::ops::Range;

/// What [`mask_lines`] reads a chunk as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaskRules {
    /// The chunk holds the attempt's first line: nothing was cut before it.
    pub starts_attempt: bool,
    /// The shortest piece of a value masked at a chunk's edges.
    pub min_piece: usize,
}

/// The lines of `body` (joined by `'\n'`, line `i` of stream `streams[i]`) with every value of
/// `values` masked as the module says, each masked run of a line replaced with `mask`; `None`
/// when nothing is masked. Values that are empty or hold a line break are skipped.
pub fn mask_lines<S: Copy + Eq>(
    streams: &[S],
    body: &str,
    values: &[String],
    mask: &str,
    rules: MaskRules,
) -> Option<String> {
    let values: Vec<&[u8]> = values
        .iter()
        .filter(|value| !value.is_empty() && !value.contains('\n'))
        .map(|value| value.as_bytes())
        .collect();
    if values.is_empty() {
        return None;
    }
    let bytes = body.as_bytes();
    // Each stream's lines joined, built in one pass over the lines.
    let mut joined: Vec<(Option<S>, Joined)> = Vec::new();
    for (i, line) in line_spans(bytes).enumerate() {
        let stream = streams.get(i).copied();
        let at = match joined.iter().position(|(s, _)| *s == stream) {
            Some(at) => at,
            None => {
                joined.push((stream, Joined::with_capacity(bytes.len())));
                joined.len() - 1
            }
        };
        joined[at].1.push(bytes, line);
    }
    let mut masked: Vec<Range<usize>> = Vec::new();
    for (_, stream) in &joined {
        for value in &values {
            for range in value_ranges(&stream.text, value, rules) {
                stream.to_body(range, &mut masked);
            }
        }
    }
    if masked.is_empty() {
        return None;
    }
    masked.sort_by_key(|range| range.start);
    // Runs that overlap or touch are one run (ranges never cover a line break, so touching
    // ranges are in the same line).
    let mut runs: Vec<Range<usize>> = Vec::with_capacity(masked.len());
    for range in masked {
        match runs.last_mut() {
            Some(last) if range.start <= last.end => last.end = last.end.max(range.end),
            _ => runs.push(range),
        }
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    for run in runs {
        out.extend_from_slice(&bytes[at..run.start]);
        out.extend_from_slice(mask.as_bytes());
        at = run.end;
    }
    out.extend_from_slice(&bytes[at..]);
    // Values and cuts lie on character boundaries (a value is text, and each line is valid text
    // on its own), so the result is text; were it not, the lossy form still masks.
    Some(match String::from_utf8(out) {
        Ok(text) => text,
        Err(err) => String::from_utf8_lossy(err.as_bytes()).into_owned(),
    })
}

/// Each line's byte range in `body`.
fn line_spans(body: &[u8]) -> impl Iterator<Item = Range<usize>> + '_ {
    let mut start = 0;
    memchr::memchr_iter(b'\n', body)
        .chain(std::iter::once(body.len()))
        .map(move |end| {
            let line = start..end;
            start = end + 1;
            line
        })
}

/// One stream's lines joined without their breaks, and where each came from in the body.
struct Joined {
    text: Vec<u8>,
    /// (start in `text`, start in the body, length), in order.
    pieces: Vec<(usize, usize, usize)>,
}

impl Joined {
    fn with_capacity(capacity: usize) -> Joined {
        Joined {
            text: Vec::with_capacity(capacity),
            pieces: Vec::new(),
        }
    }

    fn push(&mut self, body: &[u8], line: Range<usize>) {
        self.pieces.push((self.text.len(), line.start, line.len()));
        self.text.extend_from_slice(&body[line]);
    }

    /// Adds the body ranges that `range` of the joined text covers, one per line touched.
    fn to_body(&self, range: Range<usize>, out: &mut Vec<Range<usize>>) {
        let first = self
            .pieces
            .partition_point(|&(start, _, len)| start + len <= range.start);
        for &(start, body_start, len) in &self.pieces[first..] {
            if start >= range.end {
                break;
            }
            let from = range.start.max(start) - start;
            let to = range.end.min(start + len) - start;
            if from < to {
                out.push(body_start + from..body_start + to);
            }
        }
    }
}

/// The ranges of `text` (one stream's joined lines) that show `value`: every occurrence, then
/// the pieces at the edges.
fn value_ranges(text: &[u8], value: &[u8], rules: MaskRules) -> Vec<Range<usize>> {
    let mut ranges = Vec::new();
    let finder = memchr::memmem::Finder::new(value);
    let mut from = 0;
    // Overlapping occurrences too: `abab` in `ababab` masks all six bytes.
    while let Some(found) = finder.find(&text[from..]) {
        let start = from + found;
        ranges.push(start..start + value.len());
        from = start + 1;
    }
    let min_piece = rules.min_piece.max(1);
    if text.len() < min_piece || value.len() < 2 {
        return ranges;
    }
    if text.len() < value.len() && memchr::memmem::find(value, text).is_some() {
        // The whole stream of this chunk lies inside one value cut on both sides.
        ranges.push(0..text.len());
        return ranges;
    }
    if !rules.starts_attempt {
        // The chunk starts with the end of a value whose start came before.
        let head = &text[..text.len().min(value.len() - 1)];
        let piece = overlap(value, head);
        if piece >= min_piece {
            ranges.push(0..piece);
        }
    }
    // The chunk ends with the start of a value whose rest comes after.
    let tail = &text[text.len() - text.len().min(value.len() - 1)..];
    let piece = overlap(tail, value);
    if piece >= min_piece {
        ranges.push(text.len() - piece..text.len());
    }
    ranges
}

/// The longest `k` such that `a` ends with the first `k` bytes of `b` (Knuth–Morris–Pratt over
/// `a`, linear in both lengths).
fn overlap(a: &[u8], b: &[u8]) -> usize {
    if b.is_empty() {
        return 0;
    }
    // failure[i]: the longest proper prefix of b[..=i] that is also its suffix.
    let mut failure = vec![0usize; b.len()];
    let mut k = 0;
    for i in 1..b.len() {
        while k > 0 && b[i] != b[k] {
            k = failure[k - 1];
        }
        if b[i] == b[k] {
            k += 1;
        }
        failure[i] = k;
    }
    let mut state = 0;
    for &byte in a {
        if state == b.len() {
            state = failure[state - 1];
        }
        while state > 0 && byte != b[state] {
            state = failure[state - 1];
        }
        if byte == b[state] {
            state += 1;
        }
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: MaskRules = MaskRules {
        starts_attempt: false,
        min_piece: 4,
    };

    fn mask(streams: &[u8], lines: &[&str], values: &[&str], rules: MaskRules) -> Vec<String> {
        let body = lines.join("\n");
        let values: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        let masked = mask_lines(streams, &body, &values, "***", rules).unwrap_or(body);
        masked.split('\n').map(str::to_string).collect()
    }

    #[test]
    fn a_value_in_a_line_is_masked_as_before() {
        assert_eq!(
            mask(&[1, 1], &["pw=hunter2!", "ok"], &["hunter2!"], RULES),
            ["pw=***", "ok"]
        );
        assert_eq!(
            mask(&[1], &["abababab x"], &["abab"], RULES),
            ["*** x"],
            "overlapping occurrences are one run"
        );
        assert!(mask_lines(&[1u8], "nothing here", &["hunter2!".into()], "***", RULES).is_none());
        assert!(mask_lines(&[1u8], "x", &[String::new()], "***", RULES).is_none());
    }

    #[test]
    fn a_value_cut_between_two_lines_of_a_chunk_is_masked_in_both_at_every_offset() {
        let value = "s3cr3t-VALUE";
        for cut in 1..value.len() {
            let first = format!("xxxx{}", &value[..cut]);
            let second = format!("{}yyyy", &value[cut..]);
            let lines = mask(
                &[1, 2, 1],
                &[&first, "other stream", &second],
                &[value],
                RULES,
            );
            assert_eq!(
                lines,
                ["xxxx***", "other stream", "***yyyy"],
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn a_value_cut_into_three_lines_is_masked_in_each() {
        assert_eq!(
            mask(
                &[1, 1, 1],
                &["aaSECR", "ET-MIDD", "LEbb"],
                &["SECRET-MIDDLE"],
                RULES
            ),
            ["aa***", "***", "***bb"]
        );
    }

    #[test]
    fn the_edges_of_a_chunk_mask_pieces_of_min_piece_bytes_or_more() {
        let value = "s3cr3t-VALUE";
        // The chunk ends with the value's start: masked from 4 bytes on.
        assert_eq!(mask(&[1], &["log s3cr"], &[value], RULES), ["log ***"]);
        assert_eq!(mask(&[1], &["log s3c"], &[value], RULES), ["log s3c"]);
        // The chunk starts with the value's end.
        assert_eq!(
            mask(&[1], &["ALUE and more"], &[value], RULES),
            ["*** and more"]
        );
        assert_eq!(
            mask(&[1], &["LUE and more"], &[value], RULES),
            ["LUE and more"]
        );
        // Not at the start of an attempt: nothing came before.
        let first = MaskRules {
            starts_attempt: true,
            ..RULES
        };
        assert_eq!(
            mask(&[1], &["ALUE and more"], &[value], first),
            ["ALUE and more"]
        );
        // The whole chunk inside a value cut on both sides.
        assert_eq!(mask(&[1], &["cr3t-VA"], &[value], RULES), ["***"]);
        // Only the stream's own edges: the other stream's line in between does not count.
        assert_eq!(
            mask(&[1, 2], &["x s3cr3t", "y"], &[value], RULES),
            ["x ***", "y"]
        );
        // A piece in the middle of a chunk, with its neighbour there, is not an edge.
        assert_eq!(
            mask(&[1, 1], &["x s3cr3t", "unrelated"], &[value], RULES),
            ["x s3cr3t", "unrelated"]
        );
    }

    #[test]
    fn multibyte_values_and_lines_stay_text() {
        let value = "密码-ключ-ü";
        let bytes = value.as_bytes();
        for cut in (1..bytes.len()).filter(|&c| value.is_char_boundary(c)) {
            let lines = mask(
                &[1, 1],
                &[
                    &format!("é{}", &value[..cut]),
                    &format!("{}é", &value[cut..]),
                ],
                &[value],
                RULES,
            );
            assert_eq!(lines, ["é***", "***é"], "cut at {cut}");
        }
    }

    #[test]
    fn overlap_is_the_longest_suffix_that_is_a_prefix() {
        assert_eq!(overlap(b"xxabc", b"abcdef"), 3);
        assert_eq!(overlap(b"aaaa", b"aab"), 2);
        assert_eq!(overlap(b"abab", b"ababx"), 4);
        assert_eq!(overlap(b"", b"abc"), 0);
        assert_eq!(overlap(b"abc", b""), 0);
        assert_eq!(overlap(b"zzz", b"abc"), 0);
    }
}
