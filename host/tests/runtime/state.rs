use super::*;

#[test]
fn set_get_delete_across_records_and_batches() {
    let (runtime, _cache) = runtime();
    let mut instance = probe(&runtime, InstanceLimits::default());
    let first = instance.process(&batch(&["get a", "set a 1", "get a", "set a 2", "get a"])).expect("batch 1");
    assert_eq!(values(&first), ["<none>", "ok", "1", "ok", "2"]);
    let second = instance.process(&batch(&["get a", "del a", "get a", "del a", "get a"])).expect("batch 2");
    assert_eq!(values(&second), ["2", "ok", "<none>", "ok", "<none>"]);
}

#[test]
fn get_many_and_write_move_many_keys_per_call() {
    let (runtime, _cache) = runtime();
    let mut instance = probe(&runtime, InstanceLimits::default());
    let outputs = instance
        .process(&batch(&["write a=1 b=2 c=3", "getmany a b c d", "write b= c=33", "getmany a b c"]))
        .expect("process");
    assert_eq!(values(&outputs), ["ok", "1,2,3,<none>", "ok", "1,<none>,33"]);
}

/// Hex of a packed `u32` count or length.
fn n(n: u32) -> String {
    n.to_le_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

/// Hex of length-prefixed `bytes`.
fn part(bytes: &str) -> String {
    format!("{}{}", n(bytes.len() as u32), bytes.bytes().map(|b| format!("{b:02x}")).collect::<String>())
}

/// The packed calls of 0.1.3 behave as `get-many` and `write`, byte for
/// byte as the WIT lays them out, and a malformed or hostile argument traps
/// (failing the batch) with a message that says what is wrong.
#[test]
fn packed_get_many_and_write_follow_the_wit_layout() {
    let (runtime, _cache) = runtime();
    let mut instance = probe(&runtime, InstanceLimits::default());
    let write = format!("writepacked {}{}01{}{}00", n(2), part("a"), part("1"), part("b"));
    let get = format!("getpacked {}{}{}{}", n(3), part("a"), part("b"), part(""));
    let outputs = instance.process(&batch(&["set b 2", &write, "getmany a b", &get])).expect("process");
    let want = format!("{}01{}0000", n(3), part("1"));
    assert_eq!(values(&outputs), ["ok", "ok", "1,<none>", want.as_str()]);

    for (call, want) in [
        (format!("getpacked {}{}", n(2), part("a")), "malformed get-many-packed keys: 4 bytes wanted at byte 9 of 9"),
        (format!("getpacked {}{}00", n(1), part("a")), "malformed get-many-packed keys: 1 bytes left over"),
        (format!("getpacked {}", n(100_001)), "get-many of 100001 keys is over the limit of 100000"),
        (format!("getpacked {}{}ff736c756963650077", n(1), n(9)), "are the host's"),
        (format!("writepacked {}{}02", n(1), part("c")), "2 at byte 9 where 0 or 1 was due"),
        (format!("writepacked {}{}01{}", n(1), part("c"), n(9)), "9 bytes wanted at byte 14 of 14"),
    ] {
        let (runtime, _cache) = super::runtime();
        let mut instance = probe(&runtime, InstanceLimits::default());
        let error = instance.process(&batch(&[&call])).expect_err(&call);
        assert!(format!("{error:#}").contains(want), "{call}: {error:#}");
    }
}

#[test]
fn scan_prefix_sees_only_the_prefix_in_key_order_up_to_the_limit() {
    let (runtime, _cache) = runtime();
    let mut instance = probe(&runtime, InstanceLimits::default());
    instance.process(&batch(&["set user/2 b", "set user/1 a", "set other/1 x", "set user/3 c"])).expect("writes");
    let outputs =
        instance.process(&batch(&["scan user/ 10", "scan user/ 2", "del user/1", "scan user/ 10"])).expect("scans");
    assert_eq!(values(&outputs), ["user/1=a;user/2=b;user/3=c", "user/1=a;user/2=b", "ok", "user/2=b;user/3=c"]);
}

#[test]
fn the_guests_writes_become_the_checkpoint_delta() {
    let (runtime, _cache) = runtime();
    let mut instance = probe(&runtime, InstanceLimits::default());
    instance.process(&batch(&["set b 1", "set a 1", "set b 2", "del c"])).expect("writes");
    let delta = instance.state_mut().freeze(1);
    // Kept under the records' shard (partition 0).
    let key = |k: &[u8]| sluice::runtime::shard_key(0, k);
    assert_eq!(
        delta.to_vec(),
        vec![(key(b"a"), Some(b"1".to_vec())), (key(b"b"), Some(b"2".to_vec())), (key(b"c"), None)]
    );
    instance.process(&batch(&["get a"])).expect("read only");
    assert!(instance.state_mut().freeze(2).is_empty(), "reads are not changes");
}

/// The Rust SDK holds a shard's state from batch to batch (world
/// `cached`): the end of the epoch collects it, every shard's, into the
/// checkpoint, and an instance restored from that checkpoint counts on.
#[test]
fn the_state_a_guest_holds_across_batches_is_in_the_epochs_checkpoint() {
    let (runtime, _cache) = runtime();
    let on = |partition: i32, key: &str| InputRecord { partition, key: Some(key.into()), ..record("x", 0) };
    let count = |instance: &mut Instance, records: &[InputRecord]| -> Vec<String> {
        values(&instance.process(records).expect("process"))
    };
    let module = load(&runtime, "running-count");
    assert_eq!(module.world(), "packed-out");
    let mut first =
        runtime.instantiate(&module, "test/held", TaskState::in_memory(), InstanceLimits::default()).expect("new");
    first.init(&[]).expect("init");
    assert_eq!(count(&mut first, &[on(0, "a"), on(1, "a")]), ["1", "1"]);
    assert_eq!(count(&mut first, &[on(0, "a"), on(0, "b")]), ["2", "1"]);
    assert_eq!(count(&mut first, &[on(1, "a")]), ["2"]);
    first.end_epoch().expect("end of epoch");
    let delta = first.state_mut().freeze(1).to_vec();
    assert_eq!(delta.len(), 3, "each shard's keys, once: {delta:?}");

    let mut state = TaskState::in_memory();
    for (key, value) in delta {
        state.write(key, value);
    }
    let mut second = runtime.instantiate(&module, "test/held", state, InstanceLimits::default()).expect("new");
    second.init(&[]).expect("init");
    assert_eq!(count(&mut second, &[on(0, "a"), on(0, "b"), on(1, "a")]), ["3", "2", "3"]);
}

/// What a guest holds across batches is bounded by its memory limit: a
/// small guest touching many keys writes them back as it goes instead of
/// running out of memory.
#[test]
fn a_small_guest_holds_no_more_state_than_its_memory_allows() {
    let (runtime, _cache) = runtime();
    let module = load(&runtime, "running-count");
    let limits = InstanceLimits { memory_bytes: 4 << 20, ..InstanceLimits::default() };
    let mut instance = runtime.instantiate(&module, "test/small", TaskState::in_memory(), limits).expect("new");
    instance.init(&[]).expect("init");
    // 40,000 keys of 40 bytes: several times the memory with the cache's
    // overhead, were it all held. A checkpoint every 10,000 keys, as the
    // host's writes since the last one may take no more than the memory
    // limit either.
    let key = |i: usize| format!("{i:040}").into_bytes();
    let mut frozen = 0;
    for round in 0..80 {
        let batch: Vec<InputRecord> = (0..500)
            .map(|i| InputRecord { key: Some(key(round * 500 + i)), ..record("x", (round * 500 + i) as i64) })
            .collect();
        let outputs = instance.process(&batch).unwrap_or_else(|e| panic!("batch {round}: {e}"));
        assert_eq!(values(&outputs[..1]), ["1"]);
        if round % 20 == 19 {
            instance.end_epoch().expect("end of epoch");
            frozen += instance.state_mut().freeze(round as u64 / 20 + 1).len();
        }
    }
    assert_eq!(frozen, 40_000);
}

/// A write the host refuses (here: over the state's quota) while taking
/// back what the guest held cannot be pinned on its record; without
/// holding, the same write fails in its own batch, as the job's errors
/// policy needs.
#[test]
fn a_refused_held_write_fails_the_handover_and_without_holding_its_batch() {
    let (runtime, _cache) = runtime();
    let module = load(&runtime, "running-count");
    let batches: Vec<Vec<InputRecord>> = (0..4)
        .map(|b| {
            (0..50).map(|i| InputRecord { key: Some(format!("key-{b}-{i}").into_bytes()), ..record("x", i) }).collect()
        })
        .collect();
    let instance = |hold: bool| {
        let mut state = TaskState::in_memory();
        state.limit_size(2_000, 0);
        let mut instance =
            runtime.instantiate(&module, "test/quota", state, InstanceLimits::default()).expect("instance");
        if !hold {
            instance.forbid_holding();
        }
        instance.init(&[]).expect("init");
        instance
    };

    let mut held = instance(true);
    for batch in &batches {
        held.process(batch).expect("held: nothing reaches the host yet");
    }
    let e = held.end_epoch().expect_err("over the quota");
    assert!(
        matches!(&e, sluice::runtime::Error::HeldState(inner) if matches!(**inner, sluice::runtime::Error::Limit(_))),
        "{e}"
    );

    // About 15 bytes an entry (`count\0key-b-i` and `1`), 50 a batch: the
    // third batch takes the state past 2,000 bytes.
    let mut unheld = instance(false);
    for batch in &batches[..2] {
        unheld.process(batch).expect("within the quota");
    }
    let e = unheld.process(&batches[2]).expect_err("the batch that goes over the quota fails itself");
    assert!(matches!(e, sluice::runtime::Error::Limit(_)), "{e}");
}

#[test]
fn state_is_per_instance() {
    let (runtime, _cache) = runtime();
    let mut one = probe(&runtime, InstanceLimits::default());
    let mut two = probe(&runtime, InstanceLimits::default());
    one.process(&batch(&["set secret 42"])).expect("write");
    assert_eq!(values(&two.process(&batch(&["get secret"])).expect("read")), ["<none>"]);
}

/// State belongs to the input partition: one batch holding records of two
/// partitions calls the guest once per partition, and each call sees only
/// its partition's keys, in reads and in scans.
#[test]
fn state_is_per_input_partition() {
    let (runtime, _cache) = runtime();
    let mut instance = probe(&runtime, InstanceLimits::default());
    let on = |partition: i32, values: &[&str]| -> Vec<InputRecord> {
        batch(values).into_iter().map(|r| InputRecord { partition, ..r }).collect()
    };
    let mut mixed = on(0, &["set user/a zero", "get user/a"]);
    mixed.extend(on(1, &["get user/a", "set user/a one", "set user/b one"]));
    mixed.extend(on(0, &["scan user/ 10"]));
    let outputs = instance.process(&mixed).expect("process");
    assert_eq!(values(&outputs), ["ok", "zero", "<none>", "ok", "ok", "user/a=zero"]);
    let outputs = instance.process(&on(1, &["scan user/ 10", "get user/a"])).expect("process");
    assert_eq!(values(&outputs), ["user/a=one;user/b=one", "one"]);
}
