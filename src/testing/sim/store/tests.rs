use super::*;

fn put(key: &str, value: &str, lease: i64) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(Request::RequestPut(pb::PutRequest {
            key: key.into(),
            value: value.into(),
            lease,
            ..Default::default()
        })),
    }
}

fn txn(store: &mut Store, req: pb::TxnRequest) -> pb::TxnResponse {
    store.txn(&req, &|_| true).expect("applies").0
}

fn write(store: &mut Store, key: &str, value: &str) -> i64 {
    let req = pb::TxnRequest {
        success: vec![put(key, value, 0)],
        ..Default::default()
    };
    txn(store, req).header.map_or(0, |h| h.revision)
}

fn prefix(p: &str) -> pb::RangeRequest {
    let mut end = p.as_bytes().to_vec();
    *end.last_mut().expect("non-empty prefix") += 1;
    pb::RangeRequest {
        key: p.into(),
        range_end: end,
        ..Default::default()
    }
}

#[test]
fn revisions_versions_and_create_revisions_follow_etcd() {
    let mut store = Store::new();
    assert_eq!(store.revision(), 1);
    assert_eq!(write(&mut store, "a", "1"), 2);
    assert_eq!(write(&mut store, "a", "2"), 3);
    let kv = store.get(b"a").expect("written");
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (2, 3, 2));
    // A read at a past revision sees the value of then.
    let old = store
        .range(&pb::RangeRequest {
            key: b"a".to_vec(),
            revision: 2,
            ..Default::default()
        })
        .expect("readable");
    assert_eq!(old.kvs[0].value, b"1");
    assert_eq!(
        store.range(&pb::RangeRequest {
            key: b"a".to_vec(),
            revision: 9,
            ..Default::default()
        }),
        Err(Refusal::FUTURE_REV)
    );
}

#[test]
fn a_sorted_limited_range_counts_every_key_and_filters_after() {
    let mut store = Store::new();
    for k in ["p/c", "p/a", "p/b"] {
        write(&mut store, k, "");
    }
    let newest = store
        .range(&pb::RangeRequest {
            limit: 2,
            sort_target: SortTarget::Create as i32,
            sort_order: SortOrder::Descend as i32,
            max_create_revision: 3,
            ..prefix("p/")
        })
        .expect("readable");
    let keys: Vec<_> = newest.kvs.iter().map(|kv| kv.key.clone()).collect();
    assert_eq!(keys, vec![b"p/a".to_vec(), b"p/c".to_vec()]);
    // etcd counts before filters and limit.
    assert_eq!((newest.count, newest.more), (3, false));
}

#[test]
fn a_txn_reads_its_own_writes_and_judges_compares_before_them() {
    let mut store = Store::new();
    let absent = pb::Compare {
        key: b"k".to_vec(),
        target: CompareTarget::Create as i32,
        result: CompareResult::Equal as i32,
        target_union: Some(TargetUnion::CreateRevision(0)),
        ..Default::default()
    };
    let req = pb::TxnRequest {
        compare: vec![absent.clone()],
        success: vec![
            put("k", "v", 0),
            pb::RequestOp {
                request: Some(Request::RequestRange(prefix("k"))),
            },
        ],
        ..Default::default()
    };
    let resp = txn(&mut store, req.clone());
    assert!(resp.succeeded);
    let Some(Response::ResponseRange(range)) = &resp.responses[1].response else {
        panic!("a range answer");
    };
    assert_eq!(range.kvs[0].create_revision, 2);
    // Again: the key exists, the compare fails, nothing is written.
    let resp = txn(&mut store, req);
    assert!(!resp.succeeded);
    assert_eq!(store.revision(), 2);
}

#[test]
fn a_value_compare_on_a_missing_key_fails_and_a_put_with_a_missing_lease_is_refused() {
    let mut store = Store::new();
    let req = pb::TxnRequest {
        compare: vec![pb::Compare {
            key: b"missing".to_vec(),
            target: CompareTarget::Value as i32,
            result: CompareResult::NotEqual as i32,
            target_union: Some(TargetUnion::Value(b"x".to_vec())),
            ..Default::default()
        }],
        ..Default::default()
    };
    assert!(!txn(&mut store, req).succeeded);
    let req = pb::TxnRequest {
        success: vec![put("k", "v", 7)],
        ..Default::default()
    };
    assert_eq!(
        store.txn(&req, &|_| false).map(|_| ()),
        Err(Refusal::LEASE_NOT_FOUND)
    );
    assert_eq!(store.revision(), 1);
}

#[test]
fn compaction_keeps_what_is_live_and_refuses_older_history() {
    let mut store = Store::new();
    write(&mut store, "a", "1"); // 2
    write(&mut store, "b", "1"); // 3
    store.delete_keys(&[b"b".to_vec()]); // 4
    write(&mut store, "a", "2"); // 5
    store.compact(4).expect("compacts");
    assert_eq!(store.compacted(), 4);
    assert_eq!(store.get(b"a").map(|kv| kv.value), Some(b"2".to_vec()));
    assert_eq!(store.get(b"b"), None);
    assert_eq!(store.changes_since(3, b"a", b"").map(|c| c.len()), Err(4));
    let changes = store.changes_since(4, b"a", b"").expect("not compacted");
    assert_eq!(changes.iter().map(|c| c.rev).collect::<Vec<_>>(), vec![5]);
    assert_eq!(store.compact(4), Err(Refusal::COMPACTED));
}
