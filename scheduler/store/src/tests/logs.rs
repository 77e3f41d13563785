//! Conformance scenarios of log lines: chunks round-trip in line order and a resent chunk is
//! ignored, and more than a MySQL packet of lines goes in one append (`sql/logs.rs`).

use ax_core::Millis;
use ax_core::ids::Attempt;

use super::support::*;
use crate::*;

conformance!(
    logs_round_trip_in_chunks,
    thirty_megabytes_of_log_lines_go_in_one_append,
);

mod scenarios {
    use super::*;

    pub(super) async fn logs_round_trip_in_chunks(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("a", &[])])).await;
        let run = start_run(s, &wf).await;
        let id = instance_of(s, run.id, "a").await.unwrap().id;
        let odd = "tab\there \u{1F600} \u{FFFD} caf\u{e9} \\n not a newline \u{0} nul";
        let chunk = |first: u64, lines: Vec<(LogStream, String)>, at: Millis| {
            LogChunk::from_lines(id, Attempt(1), first, lines, at)
        };
        let c1 = chunk(
            1,
            vec![
                (LogStream::Stdout, "line 1".into()),
                (LogStream::Stderr, "err 2".into()),
                (LogStream::Stdout, String::new()),
            ],
            T0 + 1,
        );
        let c2 = chunk(
            4,
            vec![
                (LogStream::Stdout, odd.into()),
                (LogStream::Stderr, "err 5".into()),
            ],
            T0 + 2,
        );
        let c3 = chunk(
            6,
            (6..=1_005)
                .map(|i| (LogStream::Stdout, format!("bulk {i}")))
                .collect(),
            T0 + 3,
        );
        let other_attempt = LogChunk {
            attempt: Attempt(2),
            ..chunk(1, vec![(LogStream::Stdout, "attempt 2".into())], T0)
        };
        s.append_logs(&[c2.clone(), c1.clone()]).await.unwrap();
        s.append_logs(&[c3, other_attempt]).await.unwrap();
        // A resend of the same chunk (even with other content) is ignored.
        let resend = chunk(1, vec![(LogStream::Stdout, "changed".into())], T0 + 9);
        s.append_logs(&[resend, c1]).await.unwrap();
        s.append_logs(&[]).await.unwrap();

        let all = s.read_logs(id, Attempt(1), 0, 10_000).await.unwrap();
        assert_eq!(all.len(), 1_005);
        assert!(
            all.iter()
                .enumerate()
                .all(|(i, line)| line.seq == i as u64 + 1)
        );
        assert_eq!(
            (all[0].text.as_str(), all[0].stream, all[0].at),
            ("line 1", LogStream::Stdout, T0 + 1)
        );
        assert_eq!(
            (all[1].text.as_str(), all[1].stream),
            ("err 2", LogStream::Stderr)
        );
        assert_eq!(all[2].text, "");
        assert_eq!(
            (all[3].text.as_str(), all[3].stream, all[3].at),
            (odd, LogStream::Stdout, T0 + 2)
        );
        assert_eq!(
            (all[4].text.as_str(), all[4].stream),
            ("err 5", LogStream::Stderr)
        );
        assert_eq!(all[1_004].text, "bulk 1005");

        let page = s.read_logs(id, Attempt(1), 2, 3).await.unwrap();
        let seqs: Vec<u64> = page.iter().map(|l| l.seq).collect();
        assert_eq!(seqs, [3, 4, 5]);
        let tail = s.read_logs(id, Attempt(1), 1_000, 100).await.unwrap();
        assert_eq!(
            tail.iter().map(|l| l.seq).collect::<Vec<_>>(),
            [1_001, 1_002, 1_003, 1_004, 1_005]
        );
        assert!(
            s.read_logs(id, Attempt(1), 1_005, 10)
                .await
                .unwrap()
                .is_empty()
        );
        assert!(s.read_logs(id, Attempt(1), 0, 0).await.unwrap().is_empty());
        let second = s.read_logs(id, Attempt(2), 0, 10).await.unwrap();
        assert_eq!(second.len(), 1);
        assert_eq!(second[0].text, "attempt 2");
        assert!(s.read_logs(id, Attempt(3), 0, 10).await.unwrap().is_empty());
        assert_eq!(s.last_log_seq(id, Attempt(1)).await.unwrap(), 1_005);
        assert_eq!(s.last_log_seq(id, Attempt(2)).await.unwrap(), 1);
        assert_eq!(s.last_log_seq(id, Attempt(3)).await.unwrap(), 0);

        // Many chunks in one call go in several statements.
        let many: Vec<LogChunk> = (0..1_200u64)
            .map(|i| LogChunk {
                attempt: Attempt(5),
                ..chunk(i + 1, vec![(LogStream::Stderr, format!("n{i}"))], T0)
            })
            .collect();
        s.append_logs(&many).await.unwrap();
        let read = s.read_logs(id, Attempt(5), 1_150, 1_000).await.unwrap();
        assert_eq!(read.len(), 50);
        assert_eq!(read[0].text, "n1150");

        // Packed lines, as a worker sends them, read back line by line; a newline inside a
        // separate line is replaced, so it cannot shift the lines after it.
        let packed = LogChunk::packed(
            id,
            Attempt(6),
            1,
            vec![LogStream::Stdout, LogStream::Stderr, LogStream::Stdout],
            "first\n\nthird".into(),
            T0,
        )
        .expect("three lines, two breaks");
        let split = LogChunk::from_lines(id, Attempt(6), 4, [(LogStream::Stdout, "a\nb")], T0);
        assert_eq!(split.body(), "a b");
        s.append_logs(&[packed, split]).await.unwrap();
        let read = s.read_logs(id, Attempt(6), 0, 10).await.unwrap();
        let texts: Vec<(LogStream, &str)> =
            read.iter().map(|l| (l.stream, l.text.as_str())).collect();
        assert_eq!(
            texts,
            [
                (LogStream::Stdout, "first"),
                (LogStream::Stderr, ""),
                (LogStream::Stdout, "third"),
                (LogStream::Stdout, "a b"),
            ]
        );
        let mispacked = LogChunk::packed(
            id,
            Attempt(6),
            5,
            vec![LogStream::Stdout],
            "x\ny".into(),
            T0,
        );
        assert_eq!(
            mispacked,
            Err(MispackedLines {
                lines: 1,
                newlines: 1
            })
        );
        assert!(
            LogChunk::packed(id, Attempt(6), 5, Vec::new(), "text".into(), T0).is_err(),
            "text without lines is refused"
        );
    }

    /// More text than one MySQL packet may carry (16 MiB on MariaDB by default), in one call.
    pub(super) async fn thirty_megabytes_of_log_lines_go_in_one_append(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("a", &[])])).await;
        let run = start_run(s, &wf).await;
        let id = instance_of(s, run.id, "a").await.unwrap().id;
        let line = "y".repeat(64 << 10);
        let chunks: Vec<LogChunk> = (0..120u64)
            .map(|i| {
                LogChunk::from_lines(
                    id,
                    Attempt(1),
                    i * 4 + 1,
                    vec![(LogStream::Stdout, line.as_str()); 4],
                    T0,
                )
            })
            .collect();
        s.append_logs(&chunks)
            .await
            .expect("a large append is split, not refused");
        let mut seen = 0u64;
        loop {
            let page = s.read_logs(id, Attempt(1), seen, 100).await.unwrap();
            let Some(last) = page.last() else { break };
            assert!(page.iter().all(|l| l.text.len() == 64 << 10));
            seen = last.seq;
        }
        assert_eq!(seen, 480);
    }
}
