//! Unit tests of the waiting primitive: key layout and reading a position.

use super::*;

/// The library's own widths.
const D: Widths = Widths::DEFAULT;

#[test]
fn keys_match_go_layout() {
    let prefix = key_prefix(b"mylock").unwrap_or_default();
    assert_eq!(prefix, b"mylock/");
    assert_eq!(
        own_key(&prefix, 0x694d82254d5fa305, Mode::Exclusive),
        b"mylock/694d82254d5fa305"
    );
    assert_eq!(
        own_key(&prefix, 0x694d82254d5fa305, Mode::Shared),
        b"mylock/694d82254d5fa305.shared"
    );
    assert_eq!(
        own_key(&prefix, 0x694d82254d5fa305, Mode::Permits(3, 1)),
        b"mylock/694d82254d5fa305.permits-3"
    );
    assert!(key_prefix(b"").is_err());
    assert!(key_prefix(&vec![b'x'; MAX_NAME_LEN + 1]).is_err());
    // The longest name is accepted.
    assert_eq!(
        key_prefix(&vec![b'x'; MAX_NAME_LEN]).map(|p| p.len()).ok(),
        Some(MAX_NAME_LEN + 1)
    );
}

#[test]
fn a_name_ending_with_a_slash_is_refused_with_the_reason() {
    for name in [&b"q/"[..], b"/", b"jobs/nightly//"] {
        let error = key_prefix(name).expect_err("refused");
        assert!(error.is_invalid_argument(), "{error:?}");
        let text = error.to_string();
        assert!(text.contains("ends with '/'"), "{text}");
        assert!(text.contains("drop the trailing '/'"), "{text}");
    }
    assert_eq!(
        key_prefix(b"q/").expect_err("refused").to_string(),
        "invalid argument: name \"q/\" ends with '/': its keys (q//<lease>) would lie inside \
         the line of \"q\" (q/...), so \"q/\" could be taken while \"q\" is held; drop the \
         trailing '/'"
    );
    // A slash inside a name is a nested name, as in Go and etcdctl.
    assert_eq!(
        key_prefix(b"jobs/nightly").ok(),
        Some(b"jobs/nightly/".to_vec())
    );
    assert_eq!(key_prefix(b"/jobs").ok(), Some(b"/jobs/".to_vec()));
}

fn kv(key: &[u8], rev: i64) -> KeyValue {
    KeyValue {
        key: key.to_vec(),
        create_revision: rev,
        ..Default::default()
    }
}

fn ours(key: &[u8], mode: Mode, rev: i64) -> Ours<'_> {
    Ours {
        prefix: b"p/",
        key,
        mode,
        rev,
    }
}

/// The position from one newest-first read, if one read decides it.
fn position_of(kvs: Vec<KeyValue>, ours: Ours<'_>) -> Option<Position> {
    match before_ours(kvs, ours) {
        None => Some(Position::Gone),
        Some((before, complete)) => judge(
            D,
            ours.mode,
            ours.prefix,
            before
                .into_iter()
                .map(|kv| (kv.key, kv.create_revision))
                .collect(),
            complete,
        ),
    }
}

#[test]
fn position_read_tracks_every_key_before_ours() {
    let a = ours(b"p/a", Mode::Exclusive, 5);
    assert!(matches!(
        position_of(vec![kv(b"p/a", 5)], a),
        Some(Position::Owner)
    ));
    // Newest first: ours, then the keys before it.
    match position_of(vec![kv(b"p/a", 5), kv(b"p/b", 3), kv(b"p/c", 2)], a) {
        Some(Position::Behind(ahead)) => {
            assert_eq!(ahead.len(), 2);
            assert!(ahead.keys.blocking.contains(b"p/b".as_slice()));
            assert!(ahead.complete);
        }
        other => panic!("expected Behind, got {other:?}"),
    }
    // A full answer: only the newest keys are known.
    let mut long = vec![kv(b"p/a", 5000)];
    long.extend((0..TRACKED).map(|i| kv(format!("p/k{i}").as_bytes(), 4000 - i)));
    match position_of(long, ours(b"p/a", Mode::Exclusive, 5000)) {
        Some(Position::Behind(ahead)) => assert!(!ahead.complete),
        other => panic!("expected Behind, got {other:?}"),
    }
    for gone in [vec![kv(b"p/b", 3)], vec![kv(b"p/a", 9)], vec![]] {
        assert!(matches!(position_of(gone, a), Some(Position::Gone)));
    }
}

#[test]
fn readers_and_permits_need_older_keys_when_the_newest_let_them_hold() {
    // A full page of readers ahead of a reader: the keys before them decide.
    let mut long = vec![kv(b"p/a.shared", 5000)];
    long.extend((0..TRACKED).map(|i| kv(format!("p/{i:x}.shared").as_bytes(), 4000 - i)));
    assert!(position_of(long.clone(), ours(b"p/a.shared", Mode::Shared, 5000)).is_none());
    // A writer behind them is decided at once.
    long[0] = kv(b"p/a", 5000);
    assert!(matches!(
        position_of(long, ours(b"p/a", Mode::Exclusive, 5000)),
        Some(Position::Behind(_))
    ));
    // A permit of another size is refused.
    let mixed = vec![kv(b"p/a.permits-2", 9), kv(b"p/b.permits-3", 4)];
    assert!(matches!(
        position_of(mixed, ours(b"p/a.permits-2", Mode::Permits(2, 1), 9)),
        Some(Position::Refused(_))
    ));
}

/// A permit waits for every key ahead of it that counts: older permits of its N (by weight)
/// and keys that block it (here a key that is no lock key); `len` counts both kinds.
#[test]
fn a_permit_behind_full_permits_and_a_foreign_key_has_each_of_them_ahead() {
    let full = vec![
        kv(b"p/a.permits-2", 9),
        kv(b"p/b.permits-2", 7),
        kv(b"p/c.permits-2", 6),
    ];
    match position_of(full.clone(), ours(b"p/a.permits-2", Mode::Permits(2, 1), 9)) {
        Some(Position::Behind(ahead)) => {
            assert_eq!(ahead.len(), 2);
            assert!(ahead.keys.blocking.is_empty());
            assert_eq!(ahead.keys.counted.len(), 2);
        }
        other => panic!("expected Behind, got {other:?}"),
    }
    let mut with_foreign = full;
    with_foreign.push(kv(b"p/plain", 3));
    match position_of(with_foreign, ours(b"p/a.permits-2", Mode::Permits(2, 1), 9)) {
        Some(Position::Behind(ahead)) => {
            assert_eq!(ahead.len(), 3);
            assert_eq!(ahead.keys.blocking.len(), 1);
        }
        other => panic!("expected Behind, got {other:?}"),
    }
}

#[test]
fn a_new_key_has_every_other_key_of_the_line_ahead() {
    let a = ours(b"p/a", Mode::Exclusive, 5);
    let limit = the_line(D, b"p/", Mode::Exclusive, false).limit;
    assert!(matches!(
        ahead_of_new(D, vec![kv(b"p/a", 5)], (limit, 1), a),
        Some(Position::Owner)
    ));
    match ahead_of_new(
        D,
        vec![kv(b"p/0", 2), kv(b"p/a", 5), kv(b"p/data", 3)],
        (limit, 3),
        a,
    ) {
        Some(Position::Behind(ahead)) => {
            assert_eq!(ahead.len(), 2);
            assert!(ahead.complete);
        }
        other => panic!("expected Behind, got {other:?}"),
    }
    // As many keys as the limit: there may be more.
    let full: Vec<KeyValue> = (0..limit)
        .map(|i| kv(format!("p/k{i}").as_bytes(), i + 1))
        .collect();
    match ahead_of_new(D, full, (limit, 5000), a) {
        Some(Position::Behind(ahead)) => assert!(!ahead.complete),
        other => panic!("expected Behind, got {other:?}"),
    }
    // A reader behind readers holds with them.
    let readers = vec![kv(b"p/1.shared", 2), kv(b"p/a.shared", 5)];
    let limit = the_line(D, b"p/", Mode::Shared, false).limit;
    assert!(matches!(
        ahead_of_new(D, readers, (limit, 2), ours(b"p/a.shared", Mode::Shared, 5)),
        Some(Position::Owner)
    ));
}

#[test]
fn an_exclusive_key_reads_only_the_newest_keys_ahead_and_a_reader_reads_the_line() {
    // The newest keys first: its own, the front, and the lookout beyond it.
    let exclusive = the_line(D, b"p/", Mode::Exclusive, false);
    assert_eq!(exclusive.limit, D.front as i64 + 2);
    assert_eq!(exclusive.by_create_revision, Some(false));
    // Which keys block a reader depends on every key ahead.
    let shared = the_line(D, b"p/", Mode::Shared, false);
    // An exclusive key joining a client's waiters at the front reads the whole line too.
    assert_eq!(the_line(D, b"p/", Mode::Exclusive, true), shared);
    assert_eq!(shared.limit, TRACKED + 1);
    assert_eq!(shared.by_create_revision, None);
    // A long line read in part: the waiter watches the oldest key it read.
    let mut newest: Vec<KeyValue> = vec![kv(b"p/a", 500)];
    newest.extend((0..=D.front as i64).map(|i| kv(format!("p/k{i}").as_bytes(), 400 - i)));
    // etcd counted 100 keys, ours included.
    match ahead_of_new(
        D,
        newest,
        (exclusive.limit, 100),
        ours(b"p/a", Mode::Exclusive, 500),
    ) {
        Some(Position::Behind(ahead)) => {
            assert!(!ahead.complete);
            // The keys read are the newest `D.front + 1` ahead; the lookout leaves
            // `leaves` of them.
            let leaves = D.leaves;
            let lookout = ahead.lookout.expect("far from its turn");
            assert_eq!(
                lookout.keys,
                vec![(format!("p/k{leaves}").into_bytes(), 400 - leaves as i64)]
            );
            // 99 keys ahead: it goes when all but `leaves` of them have gone.
            assert_eq!(lookout.away, 99 - leaves);
        }
        other => panic!("expected Behind, got {other:?}"),
    }
}

#[test]
fn a_permit_reads_only_the_newest_keys_ahead_unless_the_semaphore_is_as_large() {
    // A semaphore of 8: its own key, the front, the 8 permits and one more, newest first.
    let permits = the_line(D, b"p/", Mode::Permits(8, 1), false);
    assert_eq!(permits.limit, D.front as i64 + 10);
    assert_eq!(permits.by_create_revision, Some(false));
    // Joining the client's waiters at the front, or a semaphore of nearly TRACKED
    // permits: the whole line, unsorted.
    let whole = the_line(D, b"p/", Mode::Shared, false);
    assert_eq!(the_line(D, b"p/", Mode::Permits(8, 1), true), whole);
    assert_eq!(the_line(D, b"p/", Mode::Permits(1024, 1), false), whole);
    // A line of 1,000 permits read in part: the waiter watches the newest 8 ahead.
    let own = b"p/fff.permits-8";
    let mut newest: Vec<KeyValue> = vec![kv(own, 5000)];
    newest.extend(
        (1..permits.limit).map(|i| kv(format!("p/{i:03x}.permits-8").as_bytes(), 5000 - i)),
    );
    match ahead_of_new(
        D,
        newest,
        (permits.limit, 1000),
        ours(own, Mode::Permits(8, 1), 5000),
    ) {
        Some(Position::Behind(ahead)) => {
            assert!(!ahead.complete);
            let lookout = ahead.lookout.expect("far from its turn");
            let expected: Vec<(Vec<u8>, i64)> = (1..=8)
                .rev()
                .map(|i| (format!("p/{i:03x}.permits-8").into_bytes(), 5000 - i))
                .collect();
            assert_eq!(lookout.keys, expected);
            // 999 permits ahead, each weighing at least one, 8 of them may hold: at
            // least 992 of them must go first.
            assert_eq!(lookout.away, 992);
        }
        other => panic!("expected Behind, got {other:?}"),
    }
    // A short line comes back whole: the permit knows every key ahead.
    let short = vec![
        kv(own, 50),
        kv(b"p/a.permits-8", 40),
        kv(b"p/b.permits-8", 30),
    ];
    assert!(matches!(
        ahead_of_new(
            D,
            short,
            (permits.limit, 3),
            ours(own, Mode::Permits(8, 1), 50)
        ),
        Some(Position::Owner)
    ));
}

/// A downgradable write's twin has our create revision: never a key ahead of ours, in the
/// enqueue's answer or in a position read, whichever order etcd returns the tie in.
#[test]
fn keys_at_our_own_revision_are_not_ahead() {
    let w = ours(b"p/a", Mode::Exclusive, 5);
    let limit = the_line(D, b"p/", Mode::Exclusive, false).limit;
    for line in [
        vec![kv(b"p/a", 5), kv(b"p/a.shared", 5)],
        vec![kv(b"p/a.shared", 5), kv(b"p/a", 5)],
    ] {
        assert!(matches!(
            ahead_of_new(D, line.clone(), (limit, 2), w),
            Some(Position::Owner)
        ));
        // Newest first: the tie, then the older keys.
        let mut read = line;
        assert!(matches!(
            position_of(read.clone(), w),
            Some(Position::Owner)
        ));
        read.push(kv(b"p/0", 3));
        match position_of(read, w) {
            Some(Position::Behind(ahead)) => {
                assert_eq!(ahead.len(), 1, "only the older key is ahead");
                assert!(ahead.complete);
            }
            other => panic!("expected Behind, got {other:?}"),
        }
    }
    // Our key gone, its twin left: gone.
    assert!(matches!(
        position_of(vec![kv(b"p/a.shared", 5), kv(b"p/0", 3)], w),
        Some(Position::Gone)
    ));
}

#[test]
fn the_reads_of_the_line_ask_for_keys_only_and_as_few_as_they_need() {
    // The position read: the newest keys up to ours, at most TRACKED before it.
    let read = newest_up_to(b"p/", 77);
    assert_eq!(read.limit, TRACKED + 1);
    assert_eq!(read.by_create_revision, Some(false));
    assert_eq!(read.max_create_revision, 77);
    assert!(read.keys_only, "election values can be large");
    assert_eq!((read.key, read.range_end), (b"p/".to_vec(), b"p0".to_vec()));
    // Its next page back: in the same snapshot, up to the page's oldest revision again
    // (one Txn's keys may straddle the pages), with room for the 2 keys read at it.
    let older = older_page(b"p/", 40, Some(2), 90);
    assert_eq!(older.revision, 90, "the snapshot of the first page");
    assert_eq!(
        older.max_create_revision, 40,
        "the rest of the oldest revision's keys"
    );
    assert_eq!(older.limit, TRACKED + 2);
    // One Txn's keys filled a page: the rest of the line, unlimited.
    assert_eq!(older_page(b"p/", 40, None, 90).limit, 0);
    assert!(older.keys_only && older.by_create_revision == Some(false));
    // The enqueue's reads, newest or whole: keys only.
    for (mode, whole) in [
        (Mode::Exclusive, false),
        (Mode::Permits(8, 1), false),
        (Mode::Shared, false),
        (Mode::Exclusive, true),
    ] {
        assert!(the_line(D, b"p/", mode, whole).keys_only, "{mode:?}");
    }
    // The read of our lease's keys under the name: a bounded, keys-only prefix read.
    let mine = of_lease(b"p/", 0x1f);
    assert_eq!(
        (mine.key, mine.range_end),
        (b"p/1f".to_vec(), b"p/1g".to_vec())
    );
    assert_eq!(mine.limit, TRACKED);
    assert!(mine.keys_only);
    // Of what that read finds, the other keys are those of our lease created at another
    // revision; a longer lease id that starts with ours is not ours.
    let found = vec![
        kv(b"p/1f", 9),
        kv(b"p/1f.shared", 9),
        kv(b"p/1f.permits-2", 4),
        kv(b"p/1fa", 3),
    ];
    let mut ours_first = found.clone();
    ours_first.truncate(2);
    assert_eq!(
        other_keys_of(b"p/", 0x1f, &found, 9),
        vec![b"p/1f.permits-2".to_vec()]
    );
    assert!(other_keys_of(b"p/", 0x1f, &ours_first, 9).is_empty());
    // The owner's read: the oldest key alone.
    let owner = first_created(b"p/");
    assert_eq!((owner.limit, owner.by_create_revision), (1, Some(true)));
    // A semaphore reads only the newest keys while they are fewer than the whole line.
    let largest = (TRACKED - D.front as i64 - 2) as u32;
    assert!(permits_read_newest(D, largest));
    assert!(!permits_read_newest(D, largest + 1));
}

/// A writer for a tracing subscriber that keeps what it is given.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut kept) = self.0.lock() {
            kept.extend_from_slice(bytes);
        }
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

#[test]
fn a_key_ahead_that_is_no_lock_key_is_warned_of_and_a_lock_key_is_not() {
    let warned = |keys: &[&str]| {
        let before = keys.iter().map(|k| (k.as_bytes().to_vec(), 3)).collect();
        let Some(Position::Behind(ahead)) = judge(D, Mode::Exclusive, b"jobs/", before, true)
        else {
            panic!("behind {keys:?}");
        };
        let captured = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(captured.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || warn_of_foreign_keys(b"jobs/", &ahead));
        let text = captured.0.lock().map(|t| t.clone()).unwrap_or_default();
        String::from_utf8_lossy(&text).into_owned()
    };
    let text = warned(&["jobs/nightly/694d"]);
    assert!(
        text.contains("WARN") && text.contains("not a lock key"),
        "{text}"
    );
    assert!(text.contains("jobs/nightly/694d"), "{text}");
    assert_eq!(
        warned(&["jobs/694d"]),
        "",
        "a lock key ahead is no surprise"
    );
}
