use super::*;

fn tenant() -> TenantId {
    TenantId::parse("tenant", "acme").expect("tenant")
}

fn bucket(name: &str) -> BucketName {
    BucketName::parse("bucket", name).expect("bucket")
}

fn call(journal: &Journal, bucket_name: &str, units: f64, id: Option<&str>) {
    journal
        .call(
            &tenant(),
            &bucket(bucket_name),
            &Consumption::from_request_units(units),
            0,
            id,
            Some(&serde_json::json!({ "admitted": true })),
        )
        .expect("journaled");
}

/// Writes `bytes` right after what segment `path` holds, where the agent
/// would have written its next line.
fn write_after_the_lines(path: &Path, bytes: &[u8]) {
    let held = std::fs::read(path).expect("read the segment");
    let end = held.iter().position(|b| *b == 0).unwrap_or(held.len());
    let file = OpenOptions::new().write(true).open(path).expect("open");
    file.write_all_at(bytes, end as u64).expect("write");
}

fn segments(dir: &Path) -> Vec<u64> {
    list_segments(dir)
        .expect("listed")
        .iter()
        .map(|s| s.number)
        .collect()
}

#[test]
fn what_a_dead_incarnation_admitted_and_never_sent_is_owed_once() {
    let dir = tempfile::tempdir().expect("dir");
    let opened = Journal::open(dir.path(), JournalOptions::new(9)).expect("open");
    call(&opened.journal, "emails", 2.0, Some("a"));
    call(&opened.journal, "emails", 3.0, None);
    call(&opened.journal, "", 1.5, Some("b"));
    drop(opened);

    let opened = Journal::open(dir.path(), JournalOptions::new(9)).expect("reopen");
    assert_eq!((opened.generation, opened.orphans), (2, 2));
    let ids: Vec<_> = opened
        .remembered
        .iter()
        .map(|r| r.request_id.as_str())
        .collect();
    assert_eq!(ids, ["a", "b"]);
    let owed: BTreeMap<String, f64> = opened
        .journal
        .lock()
        .orphans
        .values()
        .map(|o| (o.bucket.to_string(), o.orphan.unsent.request_units()))
        .collect();
    assert_eq!(
        owed,
        BTreeMap::from([(String::new(), 1.5), ("emails".into(), 5.0)])
    );
    drop(opened);

    // Not settled: still owed at the next start, and not twice.
    let opened = Journal::open(dir.path(), JournalOptions::new(9)).expect("reopen");
    assert_eq!((opened.generation, opened.orphans), (3, 2));
}

#[test]
fn a_line_cut_short_by_a_crash_is_dropped_and_a_garbled_one_is_an_error() {
    let dir = tempfile::tempdir().expect("dir");
    let opened = Journal::open(dir.path(), JournalOptions::new(9)).expect("open");
    call(&opened.journal, "emails", 2.0, Some("a"));
    drop(opened);
    write_after_the_lines(
        &segment_path(dir.path(), 1),
        br#"{"k":"call","tenant":"acme","buck"#,
    );
    let opened = Journal::open(dir.path(), JournalOptions::new(9)).expect("torn tail");
    assert_eq!(opened.orphans, 1);
    assert_eq!(opened.remembered.len(), 1);
    drop(opened);

    let garbled = segment_path(dir.path(), 2);
    write_after_the_lines(&garbled, b"not json\n");
    let error = Journal::open(dir.path(), JournalOptions::new(9)).expect_err("garbled");
    let message = error.to_string();
    assert!(
        message.contains(&garbled.display().to_string()) && message.contains("line 2"),
        "{message}"
    );
}

#[test]
fn segments_rotate_carry_the_ledgers_and_are_pruned() {
    let dir = tempfile::tempdir().expect("dir");
    let options = JournalOptions {
        segment_bytes: 2_000,
        keep_segments: 3,
        ..JournalOptions::new(9)
    };
    let opened = Journal::open(dir.path(), options.clone()).expect("open");
    for n in 0..200 {
        call(&opened.journal, "emails", 1.0, Some(&format!("id-{n}")));
    }
    let kept = segments(dir.path());
    assert_eq!(kept.len(), 3, "{kept:?}");
    assert!(kept[0] > 1, "the oldest were removed: {kept:?}");
    drop(opened);

    let opened = Journal::open(dir.path(), options).expect("reopen");
    assert_eq!(opened.orphans, 1);
    let owed = opened
        .journal
        .lock()
        .orphans
        .values()
        .map(|o| o.orphan.unsent.request_units())
        .sum::<f64>();
    assert_eq!(owed, 200.0, "every call, though most segments are gone");
    // Answers only from the segments kept.
    assert!(!opened.remembered.is_empty() && opened.remembered.len() < 200);
    assert_eq!(
        opened.remembered.last().map(|r| r.request_id.as_str()),
        Some("id-199")
    );
}

#[test]
fn answers_past_their_time_to_live_are_forgotten() {
    let dir = tempfile::tempdir().expect("dir");
    let opened = Journal::open(dir.path(), JournalOptions::new(9)).expect("open");
    call(&opened.journal, "emails", 1.0, Some("a"));
    drop(opened);
    let options = JournalOptions {
        answer_ttl: Duration::ZERO,
        ..JournalOptions::new(9)
    };
    std::thread::sleep(Duration::from_millis(5));
    let opened = Journal::open(dir.path(), options).expect("reopen");
    assert!(opened.remembered.is_empty());
    assert_eq!(opened.orphans, 1, "what it owes is not forgotten");
}
