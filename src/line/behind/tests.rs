//! Unit tests of the back of the line: which key a waiter watches, and the widths.

use super::*;
use crate::line::mode::Mode;

/// The keys ahead, oldest first, created at revisions 10, 11, ...
fn sorted(mode: Mode, keys: &[String]) -> (Sorted, HashMap<Vec<u8>, i64>) {
    let created = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (k.as_bytes().to_vec(), i as i64 + 10))
        .collect();
    let keys = keys.iter().map(|k| k.as_bytes().to_vec());
    (mode.sort(b"p/", keys).expect("one semaphore size"), created)
}

/// `n` key names under `p/`, in creation order, with `suffix`.
fn names(n: usize, suffix: &str) -> Vec<String> {
    (0..n).map(|i| format!("p/{i:03x}{suffix}")).collect()
}

/// The widths in force without the test hook.
const WIDTHS: (usize, usize) = (FRONT, LOOKOUT_LEAVES);

fn lookout_at(line: &[String], i: usize, away: usize) -> Option<Lookout> {
    Some(Lookout {
        keys: vec![(line[i].clone().into_bytes(), i as i64 + 10)],
        away,
    })
}

#[test]
fn a_lookout_gap_is_read_after_its_handoffs_would_take_and_never_later_than_the_cap() {
    assert_eq!(gap_read_after(20), Duration::from_millis(160));
    assert_eq!(gap_read_after(40), GAP_READ_MAX);
    assert_eq!(gap_read_after(10_000), GAP_READ_MAX);
    assert_eq!(gap_read_after(usize::MAX), GAP_READ_MAX);
}

#[test]
fn a_waiter_close_to_its_turn_has_no_lookout() {
    let (keys, created) = sorted(Mode::Exclusive, &names(FRONT, ""));
    assert_eq!(distance(&keys), FRONT);
    assert_eq!(lookout_within(WIDTHS, &keys, &created), None);
}

#[test]
fn an_exclusive_waiter_watches_the_key_whose_delete_leaves_few_ahead() {
    // FRONT + 3 keys ahead: once all but LOOKOUT_LEAVES of them are gone, in order, it
    // joins the front, with that many handoffs to spare.
    let line = names(FRONT + 3, "");
    let (keys, created) = sorted(Mode::Exclusive, &line);
    assert_eq!(distance(&keys), FRONT + 3);
    let away = FRONT + 3 - LOOKOUT_LEAVES;
    assert_eq!(
        lookout_within(WIDTHS, &keys, &created),
        lookout_at(&line, away - 1, away)
    );
    // One more than the front is far enough.
    let line = names(FRONT + 1, "");
    let (keys, created) = sorted(Mode::Exclusive, &line);
    let away = FRONT + 1 - LOOKOUT_LEAVES;
    assert_eq!(
        lookout_within(WIDTHS, &keys, &created),
        lookout_at(&line, away - 1, away)
    );
}

#[test]
fn a_far_permit_watches_as_many_of_the_newest_permits_ahead_as_there_are_permits() {
    // A semaphore of 2 with FRONT + 4 older permits: FRONT + 3 must go before we hold,
    // but any of them may, so no one key must go first (a lookout on the oldest once
    // waited forever while a younger permit was released: tests/semaphore.rs with
    // a front of 0 keys). While the two newest exist, two are ahead: one of them goes
    // before our turn.
    let line = names(FRONT + 4, ".permits-2");
    let (keys, created) = sorted(Mode::Permits(2, 1), &line);
    assert_eq!(distance(&keys), FRONT + 3);
    let newest = |n: usize| {
        (line.len() - n..line.len())
            .map(|i| (line[i].clone().into_bytes(), i as i64 + 10))
            .collect::<Vec<_>>()
    };
    let expected = |away| {
        Some(Lookout {
            keys: newest(2),
            away,
        })
    };
    assert_eq!(lookout_within(WIDTHS, &keys, &created), expected(FRONT + 3));
    assert_eq!(lookout_within((0, 0), &keys, &created), expected(FRONT + 3));
    // Near its turn: at the front.
    let (keys, created) = sorted(Mode::Permits(2, 1), &names(FRONT + 1, ".permits-2"));
    assert_eq!(lookout_within(WIDTHS, &keys, &created), None);
    // Behind a key of another mode (a Go mutex on the same name): at the front.
    let mut mixed = line.clone();
    mixed.push("p/fff".into());
    let (keys, created) = sorted(Mode::Permits(2, 1), &mixed);
    assert_eq!(lookout_within(WIDTHS, &keys, &created), None);
}

#[test]
fn with_no_front_a_permit_behind_exactly_its_room_watches_those_permits() {
    // A semaphore of 2 with 2 permits ahead: they weigh exactly its room, one must go,
    // either may. With a front of 0 keys it waits at the back, on both.
    let line = names(2, ".permits-2");
    let (keys, created) = sorted(Mode::Permits(2, 1), &line);
    assert_eq!(keys.weight(), keys.room);
    assert_eq!(distance(&keys), 1);
    let both = line
        .iter()
        .enumerate()
        .map(|(i, k)| (k.clone().into_bytes(), i as i64 + 10))
        .collect();
    assert_eq!(
        lookout_within((0, 0), &keys, &created),
        Some(Lookout {
            keys: both,
            away: 1
        })
    );
    // One permit ahead leaves room: it holds, no lookout.
    let (keys, created) = sorted(Mode::Permits(2, 1), &names(1, ".permits-2"));
    assert_eq!(lookout_within((0, 0), &keys, &created), None);
}

#[test]
fn a_far_weighted_permit_watches_the_newest_permits_that_fill_its_room() {
    // 4 permits, a request of 3 (room 2: the older permits must weigh at most 1), behind
    // FRONT + 4 permits, the newest weighing 2, then 1s: the newest alone fills the
    // room, so it alone is watched; with 1s newest, two of them.
    let mut line = names(FRONT + 3, ".permits-4");
    line.push("p/fff.permits-4.x2".into());
    let (keys, created) = sorted(Mode::Permits(4, 3), &line);
    assert_eq!(keys.weight(), FRONT + 5);
    assert!(distance(&keys) > FRONT);
    let watched = |l: Option<Lookout>| l.map(|l| l.keys.into_iter().map(|(k, _)| k));
    let newest: Vec<Vec<u8>> = vec![line[FRONT + 3].clone().into_bytes()];
    assert_eq!(
        watched(lookout_within(WIDTHS, &keys, &created)).map(Vec::from_iter),
        Some(newest)
    );
    let line = names(FRONT + 4, ".permits-4");
    let (keys, created) = sorted(Mode::Permits(4, 3), &line);
    assert_eq!(
        watched(lookout_within(WIDTHS, &keys, &created)).map(|k| k.count()),
        Some(2)
    );
    // The distance is never less than the keys that must go, oldest first: one key of
    // weight 3 ahead of a request of 2 of 4 is one key to go, not 2.
    let (keys, _) = sorted(Mode::Permits(4, 2), &["p/1.permits-4.x3".to_string()]);
    assert_eq!(distance(&keys), 1);
}

#[test]
fn with_no_front_every_waiter_watches_the_last_key_that_blocks_it() {
    let line = names(3, "");
    let (keys, created) = sorted(Mode::Exclusive, &line);
    assert_eq!(
        lookout_within((0, 0), &keys, &created),
        lookout_at(&line, 2, 3)
    );
}

#[test]
fn a_reader_ignores_the_readers_ahead_of_it() {
    // Writers and readers alternate: only the FRONT + 3 writers count.
    let line: Vec<String> = (0..2 * (FRONT + 3))
        .map(|i| format!("p/{i:03x}{}", if i % 2 == 1 { ".shared" } else { "" }))
        .collect();
    let (keys, created) = sorted(Mode::Shared, &line);
    assert_eq!(distance(&keys), FRONT + 3);
    // The writer that leaves LOOKOUT_LEAVES writers ahead: writer w is key 2w, and only
    // the writers before it count as keys to go.
    let writer = FRONT + 3 - LOOKOUT_LEAVES - 1;
    assert_eq!(
        lookout_within(WIDTHS, &keys, &created),
        lookout_at(&line, 2 * writer, writer + 1)
    );
}

#[test]
fn a_lookout_leaves_at_most_the_whole_front_ahead() {
    let with_front = |front| {
        Widths::tuned(LineTuning {
            front,
            far_start: None,
            poll_near: None,
        })
        .leaves
    };
    assert_eq!(with_front(None), LOOKOUT_LEAVES);
    assert_eq!(with_front(Some(FRONT)), LOOKOUT_LEAVES);
    assert_eq!(with_front(Some(LOOKOUT_LEAVES)), LOOKOUT_LEAVES);
    // A front narrower than LOOKOUT_LEAVES: the lookout leaves what the front holds.
    assert_eq!(with_front(Some(1)), 1);
    assert_eq!(with_front(Some(0)), 0);
}
