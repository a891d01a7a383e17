use super::*;

fn delta(entries: &[(&str, Option<&str>)]) -> Delta {
    Delta::new(entries.iter().map(|(k, v)| (k.as_bytes().to_vec(), v.map(|v| v.as_bytes().to_vec()))))
}

fn offsets(next: i64) -> Vec<PartitionOffset> {
    vec![
        PartitionOffset { topic: "in".into(), partition: 0, next_offset: next },
        PartitionOffset { topic: "in".into(), partition: 1, next_offset: next * 2 },
    ]
}

fn get(store: &CheckpointStore, key: &str) -> Option<String> {
    StateBackend::get(store, key.as_bytes()).expect("get").map(|v| String::from_utf8_lossy(&v).into_owned())
}

#[test]
fn recover_folds_up_to_the_committed_checkpoint_and_discards_the_rest() -> Result<()> {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("task-0.redb");
    {
        let store = CheckpointStore::open(&path)?;
        store.write_pending(1, &delta(&[("a", Some("1")), ("b", Some("1"))]), &offsets(10), None)?;
        store.write_pending(2, &delta(&[("a", Some("2")), ("b", None)]), &offsets(20), None)?;
        store.write_pending(3, &delta(&[("a", Some("3")), ("c", Some("3"))]), &offsets(30), None)?;
        assert_eq!(store.pending_offsets(2)?, Some(offsets(20)));
        // The process "crashes" here: the store is dropped without folding.
    }
    let store = CheckpointStore::open(&path)?;
    assert_eq!(store.pending()?, vec![1, 2, 3]);
    let recovery = store.recover(Some(2))?;
    assert_eq!(recovery, Recovery { folded: vec![1, 2], discarded: vec![3] });
    assert_eq!(get(&store, "a").as_deref(), Some("2"));
    assert_eq!(get(&store, "b"), None, "deleted in checkpoint 2");
    assert_eq!(get(&store, "c"), None, "checkpoint 3 was never committed");
    assert_eq!(store.folded()?, Some(2));
    assert!(store.pending()?.is_empty());
    // Recovering again is a no-op.
    assert_eq!(store.recover(Some(2))?, Recovery::default());
    Ok(())
}

#[test]
fn fold_is_idempotent_and_survives_reopen_after_a_durable_write() -> Result<()> {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("t.redb");
    let store = CheckpointStore::open(&path)?;
    store.write_pending(7, &delta(&[("k", Some("v7"))]), &offsets(1), None)?;
    assert_eq!(store.fold(7)?, vec![7]);
    assert_eq!(store.fold(7)?, Vec::<u64>::new());
    store.write_pending(8, &delta(&[("k", Some("v8"))]), &offsets(2), None)?;
    drop(store);
    let store = CheckpointStore::open(&path)?;
    assert_eq!(store.folded()?, Some(7));
    assert_eq!(get(&store, "k").as_deref(), Some("v7"));
    assert_eq!(store.pending()?, vec![8]);
    Ok(())
}

#[test]
fn a_fresh_start_discards_pending_but_refuses_folded_state() -> Result<()> {
    let dir = tempfile::tempdir().expect("tmp");
    let store = CheckpointStore::open(&dir.path().join("t.redb"))?;
    store.write_pending(1, &delta(&[("k", Some("v"))]), &offsets(1), None)?;
    assert_eq!(store.recover(None)?, Recovery { folded: vec![], discarded: vec![1] });
    store.write_pending(1, &delta(&[("k", Some("v"))]), &offsets(1), None)?;
    store.fold(1)?;
    let err = store.recover(None).expect_err("state without a Kafka checkpoint");
    assert!(matches!(err, Error::AheadOfKafka { folded: 1, committed: None, .. }), "{err}");
    let err = store.recover(Some(0)).expect_err("state ahead of Kafka");
    assert!(err.to_string().contains("folded checkpoint 1"), "{err}");
    Ok(())
}

#[test]
fn scan_reads_the_base_in_key_order() -> Result<()> {
    let dir = tempfile::tempdir().expect("tmp");
    let store = CheckpointStore::open(&dir.path().join("t.redb"))?;
    store.write_pending(
        1,
        &delta(&[("p/2", Some("b")), ("p/1", Some("a")), ("q", Some("x")), ("p/3", Some("c"))]),
        &[],
        None,
    )?;
    store.fold(1)?;
    let page = store.scan(b"p/", None, 2).expect("scan");
    assert_eq!(page, vec![(b"p/1".to_vec(), b"a".to_vec()), (b"p/2".to_vec(), b"b".to_vec())]);
    let rest = store.scan(b"p/", Some(b"p/2"), 10).expect("scan");
    assert_eq!(rest, vec![(b"p/3".to_vec(), b"c".to_vec())]);
    Ok(())
}

#[test]
fn blobs_round_trip() {
    let d = delta(&[("a", Some("1")), ("", Some("")), ("gone", None)]);
    let o = offsets(5);
    assert_eq!(decode(&encode(&d, &o)), Ok((d.to_vec(), o)));
    assert!(decode(&encode(&Delta::default(), &[])[..3]).is_err());
}

#[test]
fn a_migration_note_counts_only_once_its_checkpoint_is_committed() -> Result<()> {
    let dir = tempfile::tempdir().expect("tmp");
    let store = CheckpointStore::open(&dir.path().join("t.redb"))?;
    store.write_pending(1, &delta(&[("k", Some("v1"))]), &offsets(1), Some("a>b"))?;
    // Kafka never committed 1: the note goes with the discarded checkpoint.
    store.recover(None)?;
    assert_eq!(store.migrated()?, None);
    store.write_pending(1, &delta(&[("k", Some("v1"))]), &offsets(1), Some("a>b"))?;
    store.write_pending(2, &delta(&[("k", Some("v2"))]), &offsets(2), None)?;
    store.recover(Some(2))?;
    assert_eq!(store.migrated()?.as_deref(), Some("a>b"));
    Ok(())
}

#[test]
fn a_store_that_does_not_reach_kafkas_checkpoint_is_refused() -> Result<()> {
    let dir = tempfile::tempdir().expect("tmp");
    // Lost: Kafka committed 42, the store is new and empty.
    let empty = CheckpointStore::open(&dir.path().join("empty.redb"))?;
    let err = empty.recover(Some(42)).expect_err("an empty store under a committed checkpoint");
    assert!(matches!(err, Error::StateLost { folded: None, committed: 42, .. }), "{err}");
    assert!(err.to_string().contains("was lost, emptied or replaced"), "{err}");
    // Replaced by an older copy: folded 3, nothing pending up to 5.
    let old = CheckpointStore::open(&dir.path().join("old.redb"))?;
    old.write_pending(3, &delta(&[("k", Some("v3"))]), &offsets(3), None)?;
    old.fold(3)?;
    let err = old.recover(Some(5)).expect_err("an older store");
    assert!(matches!(err, Error::StateLost { folded: Some(3), committed: 5, .. }), "{err}");
    // Behind but with the pending checkpoints that close the gap: fine.
    old.write_pending(4, &delta(&[("k", Some("v4"))]), &offsets(4), None)?;
    old.write_pending(5, &delta(&[("k", Some("v5"))]), &offsets(5), None)?;
    assert_eq!(old.recover(Some(5))?.folded, vec![4, 5]);
    assert_eq!(get(&old, "k").as_deref(), Some("v5"));
    Ok(())
}

/// A store written before state was kept per input partition: a task of one
/// shard has its keys moved under that shard once, after recovery; a task of
/// several shards is refused, since its keys cannot be told apart; a fresh
/// store and an upgraded one are left as they are.
#[test]
fn a_store_from_before_shards_is_upgraded_for_one_shard_and_refused_for_more() -> Result<()> {
    let dir = tempfile::tempdir().expect("tmp");
    let unsharded = |name: &str| -> Result<CheckpointStore> {
        let store = CheckpointStore::open(&dir.path().join(name))?;
        store.write_pending(1, &delta(&[("a", Some("1")), ("b", Some("2"))]), &offsets(10), None)?;
        store.recover(Some(1))?;
        Ok(store)
    };
    let one = unsharded("one.redb")?;
    assert_eq!(one.adopt_shard_layout(&[3])?, Layout::Upgraded { keys: 2 });
    let at = |k: &str| String::from_utf8_lossy(&crate::runtime::shard_key(3, k.as_bytes())).into_owned();
    assert_eq!(get(&one, &at("a")).as_deref(), Some("1"));
    assert_eq!(get(&one, &at("b")).as_deref(), Some("2"));
    assert_eq!(get(&one, "a"), None, "the old key is gone");
    assert_eq!(one.adopt_shard_layout(&[3])?, Layout::Sharded, "once only");

    let several = unsharded("several.redb")?;
    let refused = several.adopt_shard_layout(&[0, 2]);
    assert!(matches!(refused, Err(Error::Unsharded { shards: 2, .. })), "{refused:?}");
    assert_eq!(get(&several, "a").as_deref(), Some("1"), "a refused store is left as it was");

    let fresh = CheckpointStore::open(&dir.path().join("fresh.redb"))?;
    assert_eq!(fresh.adopt_shard_layout(&[0, 1])?, Layout::Fresh);
    assert_eq!(fresh.adopt_shard_layout(&[0, 1])?, Layout::Sharded);
    Ok(())
}
