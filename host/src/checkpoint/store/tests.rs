use super::*;

/// A stored key of `shard`.
fn at(shard: u32, key: &str) -> Vec<u8> {
    shard_key(shard, key.as_bytes())
}

/// A delta of keys in shard 0, or in the shard named as `s:key`.
fn delta(entries: &[(&str, Option<&str>)]) -> Delta {
    Delta::new(entries.iter().map(|(k, v)| (stored(k), v.map(|v| v.as_bytes().to_vec()))))
}

fn stored(key: &str) -> Vec<u8> {
    match key.split_once(':') {
        Some((shard, key)) => at(shard.parse().expect("shard number"), key),
        None => at(0, key),
    }
}

/// Offsets of partitions 0 and 1 of `in`: a checkpoint of shards 0 and 1.
fn offsets(next: i64) -> Vec<PartitionOffset> {
    vec![
        PartitionOffset { topic: "in".into(), partition: 0, next_offset: next },
        PartitionOffset { topic: "in".into(), partition: 1, next_offset: next * 2 },
    ]
}

/// The task run of the tests' pending checkpoints.
const RUN: u64 = 0x5eed;

/// Kafka committed `id` for shards 0 and 1.
fn both(id: Option<u64>) -> ShardCheckpoints {
    [(0, id), (1, id)].into()
}

fn get(store: &CheckpointStore, key: &str) -> Option<String> {
    StateBackend::get(store, &stored(key)).expect("get").map(|v| String::from_utf8_lossy(&v).into_owned())
}

#[test]
fn recover_folds_up_to_the_committed_checkpoint_and_discards_the_rest() -> Result<()> {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("task-0.redb");
    {
        let store = CheckpointStore::open(&path)?;
        store.write_pending(1, RUN, &delta(&[("a", Some("1")), ("b", Some("1"))]), &offsets(10), None)?;
        store.write_pending(2, RUN, &delta(&[("a", Some("2")), ("b", None)]), &offsets(20), None)?;
        store.write_pending(3, RUN, &delta(&[("a", Some("3")), ("c", Some("3"))]), &offsets(30), None)?;
        assert_eq!(store.pending_offsets(2)?, Some(offsets(20)));
        // The process "crashes" here: the store is dropped without folding.
    }
    let store = CheckpointStore::open(&path)?;
    assert_eq!(store.pending()?, vec![1, 2, 3]);
    let recovery = store.recover(&both(Some(2)))?;
    assert_eq!(recovery, Recovery { folded: vec![1, 2], discarded: vec![3], ..Recovery::default() });
    assert_eq!(get(&store, "a").as_deref(), Some("2"));
    assert_eq!(get(&store, "b"), None, "deleted in checkpoint 2");
    assert_eq!(get(&store, "c"), None, "checkpoint 3 was never committed");
    assert_eq!(store.shards()?, [(0, 2), (1, 2)].into());
    assert_eq!(store.shard_sizes()?, [(0, ShardSize { keys: 1, bytes: 2 })].into(), "a=2; b set, then deleted");
    assert!(store.pending()?.is_empty());
    // Recovering again is a no-op.
    assert_eq!(store.recover(&both(Some(2)))?, Recovery::default());
    Ok(())
}

/// Each shard folds up to its own committed checkpoint: after a rescale a
/// task holds shards whose last commits were made by different tasks.
#[test]
fn each_shard_folds_up_to_its_own_committed_checkpoint() -> Result<()> {
    let dir = tempfile::tempdir().expect("tmp");
    let store = CheckpointStore::open(&dir.path().join("t.redb"))?;
    store.write_pending(5, RUN, &delta(&[("0:a", Some("5")), ("1:b", Some("5"))]), &offsets(5), None)?;
    store.write_pending(6, RUN, &delta(&[("0:a", Some("6")), ("1:b", Some("6"))]), &offsets(6), None)?;
    let recovery = store.recover(&[(0, Some(6)), (1, Some(5))].into())?;
    assert_eq!((recovery.folded, recovery.discarded), (vec![5, 6], vec![]));
    assert_eq!(get(&store, "0:a").as_deref(), Some("6"));
    assert_eq!(get(&store, "1:b").as_deref(), Some("5"), "shard 1 committed only 5");
    assert_eq!(store.shards()?, [(0, 6), (1, 5)].into());
    Ok(())
}

#[test]
fn fold_is_idempotent_and_survives_reopen_after_a_durable_write() -> Result<()> {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("t.redb");
    let store = CheckpointStore::open(&path)?;
    store.write_pending(7, RUN, &delta(&[("k", Some("v7"))]), &offsets(1), None)?;
    assert_eq!(store.fold(7)?, vec![7]);
    assert_eq!(store.fold(7)?, Vec::<u64>::new());
    store.write_pending(8, RUN, &delta(&[("k", Some("v8"))]), &offsets(2), None)?;
    drop(store);
    let store = CheckpointStore::open(&path)?;
    assert_eq!(store.folded(0)?, Some(7));
    assert_eq!(get(&store, "k").as_deref(), Some("v7"));
    assert_eq!(store.pending()?, vec![8]);
    Ok(())
}

/// One fold of several checkpoints applies each key's last write only, in
/// checkpoint order: a delete then a set, a set then a delete, and the
/// sizes of what is left.
#[test]
fn one_fold_of_several_checkpoints_keeps_each_keys_last_write() -> Result<()> {
    let dir = tempfile::tempdir().expect("tmp");
    let store = CheckpointStore::open(&dir.path().join("t.redb"))?;
    store.write_pending(
        1,
        RUN,
        &delta(&[("a", Some("1")), ("b", Some("1")), ("1:c", Some("1"))]),
        &offsets(1),
        None,
    )?;
    store.fold(1)?;
    store.write_pending(2, RUN, &delta(&[("a", None), ("b", Some("22")), ("d", Some("2"))]), &offsets(2), None)?;
    store.write_pending(3, RUN, &delta(&[("a", Some("333")), ("d", None), ("1:c", Some("3"))]), &offsets(3), None)?;
    store.write_pending(4, RUN, &delta(&[("b", Some("4"))]), &offsets(4), None)?;
    assert_eq!(store.fold(3)?, vec![2, 3], "checkpoint 4 was not committed yet");
    assert_eq!(get(&store, "a").as_deref(), Some("333"), "deleted in 2, set again in 3");
    assert_eq!(get(&store, "b").as_deref(), Some("22"));
    assert_eq!(get(&store, "d"), None, "set in 2, deleted in 3");
    assert_eq!(get(&store, "1:c").as_deref(), Some("3"));
    assert_eq!(store.shards()?, [(0, 3), (1, 3)].into());
    let sizes = [(0, ShardSize { keys: 2, bytes: 1 + 3 + 1 + 2 }), (1, ShardSize { keys: 1, bytes: 2 })];
    assert_eq!(store.shard_sizes()?, sizes.into());
    assert_eq!(store.pending()?, vec![4]);
    Ok(())
}

#[test]
fn a_fresh_start_discards_pending_but_refuses_folded_state() -> Result<()> {
    let dir = tempfile::tempdir().expect("tmp");
    let store = CheckpointStore::open(&dir.path().join("t.redb"))?;
    store.write_pending(1, RUN, &delta(&[("k", Some("v"))]), &offsets(1), None)?;
    assert_eq!(store.recover(&both(None))?, Recovery { discarded: vec![1], ..Recovery::default() });
    store.write_pending(1, RUN, &delta(&[("k", Some("v"))]), &offsets(1), None)?;
    store.fold(1)?;
    let err = store.recover(&both(None)).expect_err("state without a Kafka checkpoint");
    assert!(matches!(err, Error::AheadOfKafka { folded: 1, committed: None, .. }), "{err}");
    let err = store.recover(&both(Some(0))).expect_err("state ahead of Kafka");
    assert!(err.to_string().contains("folded checkpoint 1 of shard 0"), "{err}");
    Ok(())
}

#[test]
fn scan_reads_the_base_in_key_order() -> Result<()> {
    let dir = tempfile::tempdir().expect("tmp");
    let store = CheckpointStore::open(&dir.path().join("t.redb"))?;
    store.write_pending(
        1,
        RUN,
        &delta(&[("p/2", Some("b")), ("p/1", Some("a")), ("q", Some("x")), ("p/3", Some("c"))]),
        &offsets(1),
        None,
    )?;
    store.fold(1)?;
    let page = store.scan(&at(0, "p/"), None, 2).expect("scan");
    assert_eq!(page, vec![(at(0, "p/1"), b"a".to_vec()), (at(0, "p/2"), b"b".to_vec())]);
    let rest = store.scan(&at(0, "p/"), Some(&at(0, "p/2")), 10).expect("scan");
    assert_eq!(rest, vec![(at(0, "p/3"), b"c".to_vec())]);
    Ok(())
}

#[test]
fn blobs_round_trip() {
    let d = delta(&[("a", Some("1")), ("", Some("")), ("gone", None)]);
    let o = offsets(5);
    let blob = encode(&d, &o);
    let owned = d.to_vec();
    let borrowed: Vec<(&[u8], Option<&[u8]>)> = owned.iter().map(|(k, v)| (k.as_slice(), v.as_deref())).collect();
    assert_eq!(decode(&blob), Ok((borrowed, o)));
    assert!(decode(&encode(&Delta::default(), &[])[..3]).is_err());
}

#[test]
fn a_migration_note_counts_only_once_its_checkpoint_is_committed() -> Result<()> {
    let dir = tempfile::tempdir().expect("tmp");
    let store = CheckpointStore::open(&dir.path().join("t.redb"))?;
    store.write_pending(1, RUN, &delta(&[("k", Some("v1"))]), &offsets(1), Some("a>b"))?;
    // Kafka never committed 1: the note goes with the discarded checkpoint.
    store.recover(&both(None))?;
    assert_eq!(store.migrated(0)?, None);
    store.write_pending(1, RUN, &delta(&[("k", Some("v1"))]), &offsets(1), Some("a>b"))?;
    store.write_pending(2, RUN, &delta(&[("k", Some("v2"))]), &offsets(2), None)?;
    store.recover(&both(Some(2)))?;
    assert_eq!(store.migrated(0)?.as_deref(), Some("a>b"));
    assert_eq!(store.migrated(1)?.as_deref(), Some("a>b"), "every shard the checkpoint covers");
    Ok(())
}

#[test]
fn a_store_that_does_not_reach_kafkas_checkpoint_is_refused() -> Result<()> {
    let dir = tempfile::tempdir().expect("tmp");
    // Lost: Kafka committed 42, the store is new and empty.
    let empty = CheckpointStore::open(&dir.path().join("empty.redb"))?;
    let recovery = empty.recover(&both(Some(42)))?;
    assert_eq!(recovery.behind, [(0, (None, 42)), (1, (None, 42))].into());
    let err = empty.require_current(&recovery).expect_err("an empty store under a committed checkpoint");
    assert!(matches!(err, Error::StateLost { folded: None, committed: 42, .. }), "{err}");
    assert!(err.to_string().contains("was lost, emptied or replaced"), "{err}");
    // Replaced by an older copy: folded 3, nothing pending up to 5.
    let old = CheckpointStore::open(&dir.path().join("old.redb"))?;
    old.write_pending(3, RUN, &delta(&[("k", Some("v3"))]), &offsets(3), None)?;
    old.fold(3)?;
    let err = old.require_current(&old.recover(&both(Some(5)))?).expect_err("an older store");
    assert!(matches!(err, Error::StateLost { folded: Some(3), committed: 5, .. }), "{err}");
    // Behind but with the pending checkpoints that close the gap: fine.
    old.write_pending(4, RUN, &delta(&[("k", Some("v4"))]), &offsets(4), None)?;
    old.write_pending(5, RUN, &delta(&[("k", Some("v5"))]), &offsets(5), None)?;
    let recovery = old.recover(&both(Some(5)))?;
    assert_eq!((recovery.folded, recovery.behind), (vec![4, 5], BTreeMap::new()));
    assert_eq!(get(&old, "k").as_deref(), Some("v5"));
    Ok(())
}

/// A shard moves to another task's store with its keys, marker and note,
/// replacing whatever copy was there; the old owner then drops it.
#[test]
fn a_shard_moves_whole_and_replaces_a_stale_copy() -> Result<()> {
    let dir = tempfile::tempdir().expect("tmp");
    let a = CheckpointStore::open(&dir.path().join("a.redb"))?;
    let b = CheckpointStore::open(&dir.path().join("b.redb"))?;
    a.write_pending(57, RUN, &delta(&[("1:x", Some("a57")), ("0:y", Some("a57"))]), &offsets(1), Some("m"))?;
    a.recover(&both(Some(57)))?;
    // b holds an old copy of shard 1 (it had the shard long ago).
    b.write_pending(12, RUN, &delta(&[("1:x", Some("b12")), ("1:old", Some("b12"))]), &offsets(1), None)?;
    b.recover(&both(Some(12)))?;
    assert_eq!(b.take_shard(1, &a)?, 1);
    assert_eq!(get(&b, "1:x").as_deref(), Some("a57"));
    assert_eq!(get(&b, "1:old"), None, "the stale copy is gone");
    assert_eq!((b.folded(1)?, b.migrated(1)?.as_deref()), (Some(57), Some("m")));
    assert_eq!(b.take_shard(1, &a)?, 1, "repeating the copy is harmless");
    assert_eq!(a.retain_shards(&[0])?, vec![1]);
    assert_eq!((get(&a, "1:x"), a.folded(1)?), (None, None));
    assert_eq!(get(&a, "0:y").as_deref(), Some("a57"), "the shard it keeps is untouched");
    assert_eq!(b.shard_size(1)?, ShardSize { keys: 1, bytes: 4 });
    Ok(())
}

/// The trap DESIGN.md names: a shard leaves a task at checkpoint 57 for one
/// at 12. A delta of the shard left in the second store from long ago has an
/// id (13) below the shard's marker, so it is never folded into the shard,
/// even though 13 <= Kafka's committed id.
#[test]
fn a_stale_delta_is_never_folded_into_a_shard_that_came_back() -> Result<()> {
    let dir = tempfile::tempdir().expect("tmp");
    let a = CheckpointStore::open(&dir.path().join("a.redb"))?;
    let b = CheckpointStore::open(&dir.path().join("b.redb"))?;
    b.write_pending(13, RUN, &delta(&[("1:x", Some("stale"))]), &offsets(1), None)?;
    a.write_pending(57, RUN, &delta(&[("1:x", Some("a57"))]), &offsets(1), None)?;
    a.recover(&both(Some(57)))?;
    b.take_shard(1, &a)?;
    let recovery = b.recover(&[(1, Some(58))].into())?;
    assert_eq!(recovery.behind, [(1, (Some(57), 58))].into(), "13 is not folded into the shard");
    let recovery = b.recover(&[(1, Some(57))].into())?;
    assert_eq!(recovery.discarded, Vec::<u64>::new(), "already dropped by the first recovery");
    assert_eq!(get(&b, "1:x").as_deref(), Some("a57"));
    Ok(())
}

/// Stores from before shards (keys without their shard, one marker per
/// task) and from before per-shard markers are upgraded at recovery: a task
/// of one shard has its keys moved under that shard; a task of several
/// shards is refused, since its keys cannot be told apart; keys that carried
/// their shard already keep it, and every shard gets the task's marker.
#[test]
fn stores_of_earlier_layouts_are_upgraded_at_recovery() -> Result<()> {
    let dir = tempfile::tempdir().expect("tmp");
    let old_store = |name: &str, layout: Option<u64>, key: &[u8]| -> Result<PathBuf> {
        let path = dir.path().join(name);
        let db = Database::create(&path).map_err(|e| Error::Storage { path: path.clone(), source: e.into() })?;
        let write = || -> Result<(), redb::Error> {
            let tx = db.begin_write()?;
            tx.open_table(BASE)?.insert(key, b"1".as_slice())?;
            let mut meta = tx.open_table(META)?;
            meta.insert(LEGACY_FOLDED, 4)?;
            if let Some(layout) = layout {
                meta.insert(LAYOUT, layout)?;
            }
            tx.open_table(LEGACY_NOTES)?.insert(LEGACY_MIGRATED, "m")?;
            drop(meta);
            tx.commit()?;
            Ok(())
        };
        write().map_err(|source| Error::Storage { path: path.clone(), source })?;
        Ok(path)
    };
    let one = CheckpointStore::open(&old_store("one.redb", None, b"a")?)?;
    let recovery = one.recover(&[(3, Some(4))].into())?;
    assert_eq!(recovery.upgraded_keys, Some(1));
    assert_eq!(get(&one, "3:a").as_deref(), Some("1"));
    assert_eq!(StateBackend::get(&one, b"a").expect("get"), None, "the old key is gone");
    assert_eq!((one.folded(3)?, one.migrated(3)?.as_deref()), (Some(4), Some("m")));
    assert_eq!(one.recover(&[(3, Some(4))].into())?.upgraded_keys, None, "once only");

    let several = CheckpointStore::open(&old_store("several.redb", None, b"a")?)?;
    let refused = several.recover(&[(0, Some(4)), (2, Some(4))].into());
    assert!(matches!(refused, Err(Error::Unsharded { shards: 2, .. })), "{refused:?}");
    assert_eq!(StateBackend::get(&several, b"a").expect("get"), Some(b"1".to_vec()), "left as it was");

    let keyed = CheckpointStore::open(&old_store("keyed.redb", Some(SHARDED_KEYS), &at(2, "b"))?)?;
    assert_eq!(keyed.recover(&[(0, Some(4)), (2, Some(4))].into())?.upgraded_keys, Some(0));
    assert_eq!(get(&keyed, "2:b").as_deref(), Some("1"));
    assert_eq!(keyed.shards()?, [(0, 4), (2, 4)].into());
    Ok(())
}

/// A restore chunk is written in key order, but a key's later changelog
/// records still win over its earlier ones.
#[test]
fn a_restore_chunk_keeps_the_last_write_of_each_key() -> Result<()> {
    let dir = tempfile::tempdir().expect("tmp");
    let store = CheckpointStore::open(&dir.path().join("task-0.redb"))?;
    let record = |k: &str, v: Option<&str>| (k.as_bytes().to_vec(), v.map(|v| v.as_bytes().to_vec()));
    store.restore_chunk(
        0,
        &[
            record("b", Some("1")),
            record("a", Some("1")),
            record("b", Some("2")),
            record("c", Some("1")),
            record("a", None),
            record("c", Some("2")),
            record("a", Some("3")),
            record("c", None),
        ],
    )?;
    store.finish_restore(0, 7)?;
    assert_eq!((get(&store, "a"), get(&store, "b"), get(&store, "c")), (Some("3".into()), Some("2".into()), None));
    assert_eq!(store.shard_size(0)?.keys, 2);
    assert_eq!(store.folded(0)?, Some(7));
    Ok(())
}

/// A host whose task was fenced after writing pending 8 (a zombie); another
/// host committed its own checkpoint 8 for the shards; they come back here.
/// The pending 8 of this store is not Kafka's 8: it is not folded, and the
/// shards are behind (restored from the changelog, or refused).
#[test]
fn a_pending_checkpoint_of_another_run_is_not_the_committed_one() -> Result<()> {
    let dir = tempfile::tempdir().expect("tmp");
    let store = CheckpointStore::open(&dir.path().join("task-0.redb"))?;
    store.write_pending(7, RUN, &delta(&[("k", Some("v7"))]), &offsets(1), None)?;
    store.fold(7)?;
    store.write_pending(8, RUN, &delta(&[("k", Some("zombie"))]), &offsets(2), None)?;
    let elsewhere: BTreeMap<u32, u64> = [(0, 0xbeef), (1, 0xbeef)].into();
    let recovery = store.recover_runs(&both(Some(8)), &elsewhere)?;
    assert_eq!(get(&store, "k").as_deref(), Some("v7"), "the zombie's write was taken for the committed one");
    assert_eq!(recovery.discarded, vec![8]);
    assert_eq!(recovery.behind.get(&0), Some(&(Some(7), 8)));

    // The same run's pending 8 is the committed one.
    let store = CheckpointStore::open(&dir.path().join("task-1.redb"))?;
    store.write_pending(8, 0xbeef, &delta(&[("k", Some("v8"))]), &offsets(2), None)?;
    let recovery = store.recover_runs(&both(Some(8)), &elsewhere)?;
    assert_eq!(get(&store, "k").as_deref(), Some("v8"));
    assert!(recovery.behind.is_empty(), "{recovery:?}");

    // Kafka names no run (a checkpoint of an earlier host): as before.
    let store = CheckpointStore::open(&dir.path().join("task-2.redb"))?;
    store.write_pending(8, RUN, &delta(&[("k", Some("v8"))]), &offsets(2), None)?;
    store.recover_runs(&both(Some(8)), &BTreeMap::new())?;
    assert_eq!(get(&store, "k").as_deref(), Some("v8"));
    Ok(())
}

/// A store another incarnation of the job wrote is emptied when the next
/// incarnation adopts it, whatever its markers say: with the same committed
/// id it would otherwise pass for current, and with a higher one refuse to
/// start as ahead of Kafka.
#[test]
fn a_store_of_another_incarnation_holds_nothing_of_the_next() -> Result<()> {
    const OLD: u64 = 0xa11ce;
    const NEW: u64 = 0xb0b;
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("task-0.redb");
    let store = CheckpointStore::open(&path)?;
    assert_eq!(store.adopt(OLD)?, None, "a new store holds nothing to discard");
    store.write_pending(7, RUN, &delta(&[("a", Some("old")), ("1:b", Some("old"))]), &offsets(70), Some("note"))?;
    store.recover(&both(Some(7)))?;
    store.write_pending(8, RUN, &delta(&[("a", Some("pending"))]), &offsets(80), None)?;
    assert_eq!(store.adopt(OLD)?, None, "the same incarnation keeps its state");
    assert_eq!(store.pending()?, vec![8]);
    drop(store);
    assert_eq!(CheckpointStore::incarnation_at(&path)?, Some(OLD));

    // The next incarnation committed checkpoint 7 too: an id of its own.
    let store = CheckpointStore::open(&path)?;
    let discarded = store.adopt(NEW)?;
    assert_eq!(discarded, Some(Discarded { incarnation: OLD, shards: [(0, 7), (1, 7)].into(), pending: 1 }));
    assert_eq!(get(&store, "a"), None);
    assert!(store.shards()?.is_empty() && store.pending()?.is_empty() && store.shard_sizes()?.is_empty());
    assert_eq!(store.migrated(0)?, None);
    let recovery = store.recover(&both(Some(7)))?;
    assert_eq!(recovery.behind, [(0, (None, 7)), (1, (None, 7))].into(), "absent: restored from the changelog");
    // Kafka committed nothing yet (a reset cleared it): a fresh start, not ahead of Kafka.
    let store = CheckpointStore::open(&dir.path().join("task-1.redb"))?;
    store.adopt(OLD)?;
    store.write_pending(3, RUN, &delta(&[("a", Some("old"))]), &offsets(30), None)?;
    store.recover(&both(Some(3)))?;
    assert!(matches!(store.recover(&both(None)), Err(Error::AheadOfKafka { .. })), "what the old code met");
    store.adopt(NEW)?;
    assert_eq!(store.recover(&both(None))?, Recovery::default());
    // A store of a host before incarnations is incarnation 0's.
    let legacy = dir.path().join("task-2.redb");
    CheckpointStore::open(&legacy)?.write_pending(1, RUN, &delta(&[("a", Some("1"))]), &offsets(1), None)?;
    assert_eq!(CheckpointStore::incarnation_at(&legacy)?, Some(0));
    assert_eq!(CheckpointStore::open(&legacy)?.adopt(0)?, None);
    assert_eq!(CheckpointStore::incarnation_at(&dir.path().join("none.redb"))?, None);
    Ok(())
}

/// The store's scan, too, starts at the prefix for a `start_after` before
/// it.
#[test]
fn a_scan_from_before_the_prefix_starts_at_the_prefix() -> Result<()> {
    let dir = tempfile::tempdir().expect("tmp");
    let store = CheckpointStore::open(&dir.path().join("t.redb"))?;
    store.write_pending(
        1,
        RUN,
        &delta(&[("a", Some("x")), ("p/1", Some("a")), ("p/2", Some("b"))]),
        &offsets(1),
        None,
    )?;
    store.fold(1)?;
    // A key ("a") lies between the start and the prefix.
    let page = store.scan(&at(0, "p/"), Some(&at(0, "0")), 10).expect("scan");
    assert_eq!(page, vec![(at(0, "p/1"), b"a".to_vec()), (at(0, "p/2"), b"b".to_vec())]);
    Ok(())
}
